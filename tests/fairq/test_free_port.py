"""free_port: a port found free is bound later by a child, so one process never hands
out a port twice, nor one it was told is taken."""

from __future__ import annotations

import socket

from fairq.localredis import claim_port, free_port


def test_a_process_never_gets_one_port_twice() -> None:
    # ~14,000 ports to pick from: among 2,000 lookups the kernel repeats some.
    ports = [free_port() for _ in range(2000)]
    assert len(set(ports)) == len(ports)


def test_a_claimed_port_is_not_handed_out_and_each_port_is_bindable() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        claimed = int(s.getsockname()[1])
    claim_port(claimed)
    ports = [free_port() for _ in range(500)]
    assert claimed not in ports
    with socket.socket() as s:
        s.bind(("127.0.0.1", ports[-1]))  # free when handed out: nothing of ours bound it
