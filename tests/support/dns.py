"""A real DNS server on 127.0.0.1 for tests (dnslib's, UDP, in a thread) over a zone the
test changes as it goes: a name's A and AAAA records, a name that does not exist
(NXDOMAIN), or a server that fails (SERVFAIL)."""

from __future__ import annotations

import contextlib
import ipaddress
import socket
import threading
from collections.abc import Iterable, Iterator

from dnslib import AAAA, QTYPE, RCODE, RR, A, DNSRecord
from dnslib.server import DNSHandler, DNSLogger, DNSServer

_TTL_S = 5  # CoreDNS's default for a headless Service's records


class Zone:
    """Names and their addresses; thread-safe (the server answers from its own thread)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._names: dict[str, tuple[str, ...]] = {}
        self.servfail = False  # answer every question with SERVFAIL
        self.questions = 0

    def set(self, name: str, addresses: Iterable[str]) -> None:
        """``name`` has exactly these addresses (none: it exists with no record)."""
        with self._lock:
            self._names[_key(name)] = tuple(addresses)

    def remove(self, name: str) -> None:
        """``name`` no longer exists (NXDOMAIN)."""
        with self._lock:
            self._names.pop(_key(name), None)

    def resolve(self, request: DNSRecord, handler: DNSHandler) -> DNSRecord:
        """dnslib's resolver interface: the reply to ``request``."""
        reply = request.reply()
        question = request.q
        with self._lock:
            self.questions += 1
            if self.servfail:
                reply.header.rcode = RCODE.SERVFAIL
                return reply
            addresses = self._names.get(_key(str(question.qname)))
        if addresses is None:
            reply.header.rcode = RCODE.NXDOMAIN
            return reply
        for address in addresses:
            version = ipaddress.ip_address(address).version
            if question.qtype == QTYPE.A and version == 4:
                reply.add_answer(RR(question.qname, QTYPE.A, rdata=A(address), ttl=_TTL_S))
            if question.qtype == QTYPE.AAAA and version == 6:
                reply.add_answer(RR(question.qname, QTYPE.AAAA, rdata=AAAA(address), ttl=_TTL_S))
        return reply


def _key(name: str) -> str:
    return name.lower().rstrip(".")


@contextlib.contextmanager
def dns_server() -> Iterator[tuple[Zone, str]]:
    """A DNS server on a free UDP port of 127.0.0.1; yields its zone and its
    ``"127.0.0.1:port"`` (a model's ``discovery.nameservers`` entry); stopped after."""
    zone = Zone()
    quiet = DNSLogger(log="-recv,-send,-request,-reply,-truncated,-error,-data", logf=_drop)
    server = DNSServer(zone, address="127.0.0.1", port=0, logger=quiet)
    server.start_thread()
    try:
        yield zone, f"127.0.0.1:{server.server.server_address[1]}"
    finally:
        server.stop()
        server.server.server_close()
        server.thread.join(5)
        assert not server.thread.is_alive(), "the DNS server did not stop"


@contextlib.contextmanager
def silent_dns() -> Iterator[str]:
    """A UDP port on 127.0.0.1 that takes questions and never answers (a DNS timeout);
    yields its ``"127.0.0.1:port"``."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        yield f"127.0.0.1:{sock.getsockname()[1]}"


def _drop(_line: str) -> None:
    """dnslib's log lines: none in the tests' output."""
