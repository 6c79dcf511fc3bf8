"""The scaler's TLS files, read again when they are renewed (cert-manager rewrites a
certificate's Secret before it expires; Kubernetes swaps the mounted files in place).

gRPC asks ``CertFiles.renewed`` before every new connection's handshake: it compares the
files' modification times (a stat each, no read), and only when one changed reads them
again. A connection already open keeps the certificate it was made with. A file that
cannot be read, or reads as a pair gRPC refuses, leaves the current ones in use and is
logged once per change.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import grpc

log = logging.getLogger(__name__)


class TlsFileError(OSError):
    """A TLS file could not be read."""


class CertFiles:
    """The server's key and certificate chain, and the CA its clients must be signed by
    (None: any client)."""

    def __init__(self, key: Path, cert: Path, client_ca: Path | None) -> None:
        self._paths = [p for p in (key, cert, client_ca) if p is not None]
        self._key, self._cert, self._client_ca = key, cert, client_ca
        self._seen = self._times()

    @property
    def requires_client(self) -> bool:
        return self._client_ca is not None

    def load(self) -> grpc.ServerCertificateConfiguration:
        """The configuration from the files as they are now; TlsFileError if one is
        unreadable."""
        try:
            pair = (self._key.read_bytes(), self._cert.read_bytes())
            ca = self._client_ca.read_bytes() if self._client_ca is not None else None
        except OSError as exc:
            raise TlsFileError(f"cannot read a TLS file: {exc}") from exc
        return grpc.ssl_server_certificate_configuration([pair], ca)

    def renewed(self) -> grpc.ServerCertificateConfiguration | None:
        """The files' new configuration if any changed since last seen, else None (gRPC:
        keep the current one)."""
        times = self._times()
        if times == self._seen:
            return None
        self._seen = times
        try:
            config = self.load()
        except TlsFileError as exc:
            log.warning("keda scaler: renewed TLS files not used: %s", exc)
            return None
        log.info("keda scaler: TLS files renewed; new connections use them")
        return config

    def credentials(self) -> grpc.ServerCredentials:
        """Server credentials that follow the files (``renewed``)."""
        return grpc.dynamic_ssl_server_credentials(
            self.load(), self.renewed, require_client_authentication=self.requires_client
        )

    def _times(self) -> tuple[int | None, ...]:
        return tuple(_mtime(p) for p in self._paths)


def _mtime(path: Path) -> int | None:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return None
