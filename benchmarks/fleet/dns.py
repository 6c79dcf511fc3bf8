"""The fleet benchmark's DNS: a UDP server on 127.0.0.1 answering A and AAAA questions
from a zone the benchmark changes as replicas become ready and leave (one name per
model, as a Kubernetes headless Service has one record per ready pod).

Built on dnspython (a dependency of fairq's dispatcher already), in a thread of its own.
A name in the zone with no address answers with no record (a Service with no ready
pod); a name not in it answers NXDOMAIN.

The zone keeps when each address was first answered (``found_s``: the dispatcher's read
that found the replica) and when its name was first answered after the address went
(``dropped_s``: the read after which no dispatcher sends to it), so the report can tell
the dispatcher's DNS reads from the other steps.
"""

from __future__ import annotations

import contextlib
import ipaddress
import socket
import threading
import time
from collections.abc import Iterable, Iterator

import dns.exception
import dns.message
import dns.rcode
import dns.rdataclass
import dns.rdatatype
import dns.rrset

TTL_S = 5  # CoreDNS's default for a headless Service's records
_POLL_S = 0.2  # how often the server thread looks at its stop flag


class Zone:
    """Names and their addresses; thread-safe (the server answers from its own thread)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._names: dict[str, tuple[str, ...]] = {}
        self._gone: dict[str, set[str]] = {}  # name -> addresses removed since its last read
        self.questions = 0
        self.found_s: dict[str, float] = {}  # address -> first answer with it (monotonic)
        self.dropped_s: dict[str, float] = {}  # address -> first answer of its name after

    def set(self, name: str, addresses: Iterable[str]) -> None:
        """``name`` has exactly these addresses (none: it exists with no record)."""
        with self._lock:
            self._names[_key(name)] = tuple(addresses)

    def add(self, name: str, address: str) -> None:
        with self._lock:
            old = self._names.get(_key(name), ())
            self._names[_key(name)] = (*old, address) if address not in old else old

    def discard(self, name: str, address: str) -> None:
        with self._lock:
            old = self._names.get(_key(name), ())
            self._names[_key(name)] = tuple(a for a in old if a != address)
            if address in old:
                self._gone.setdefault(_key(name), set()).add(address)

    def lookup(self, name: str) -> tuple[str, ...] | None:
        """The name's addresses now (None: no such name); notes the read (class docstring).
        A read asks A and AAAA at once, or A alone: any question of the name counts."""
        now_s = time.monotonic()
        with self._lock:
            self.questions += 1
            addresses = self._names.get(_key(name))
            for address in addresses or ():
                self.found_s.setdefault(address, now_s)
            for address in self._gone.pop(_key(name), ()):
                self.dropped_s.setdefault(address, now_s)
            return addresses


def answer(zone: Zone, wire: bytes) -> bytes | None:
    """The reply to one DNS question in wire format (None: not a question to answer)."""
    try:
        query = dns.message.from_wire(wire)
    except dns.exception.DNSException:
        return None
    if not query.question:
        return None
    reply = dns.message.make_response(query)
    question = query.question[0]
    addresses = zone.lookup(question.name.to_text(omit_final_dot=True))
    if addresses is None:
        reply.set_rcode(dns.rcode.NXDOMAIN)
        return reply.to_wire()
    version = {dns.rdatatype.A: 4, dns.rdatatype.AAAA: 6}.get(question.rdtype)
    matching = [a for a in addresses if ipaddress.ip_address(a).version == version]
    if matching:
        rrset = dns.rrset.from_text_list(
            question.name, TTL_S, dns.rdataclass.IN, question.rdtype, matching
        )
        reply.answer.append(rrset)
    return reply.to_wire()


@contextlib.contextmanager
def dns_server(zone: Zone) -> Iterator[str]:
    """Serve ``zone`` on a free UDP port of 127.0.0.1 until the block ends; yields its
    ``"127.0.0.1:port"`` (a model's ``discovery.nameservers`` entry)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.settimeout(_POLL_S)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                wire, peer = sock.recvfrom(4096)
            except TimeoutError:
                continue
            except OSError:
                return  # the socket was closed
            reply = answer(zone, wire)
            if reply is not None:
                with contextlib.suppress(OSError):
                    sock.sendto(reply, peer)

    thread = threading.Thread(target=serve, name="fleet-dns", daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{sock.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(5)
        sock.close()


def _key(name: str) -> str:
    return name.lower().rstrip(".")
