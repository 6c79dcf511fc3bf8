"""free_port: a port found free is bound later by a child, so one process never hands
out a port twice, nor one it was told is taken; with FAIRQ_LOCAL_PORTS, only ports of
that range."""

from __future__ import annotations

import socket

import pytest

from fairq.stack.localredis import LOCAL_PORTS_ENV, claim_port, free_port


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


def test_a_range_given_is_where_ports_come_from(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(LOCAL_PORTS_ENV, "23000-23199")
    ports = [free_port() for _ in range(50)]
    assert all(23000 <= port <= 23199 for port in ports)
    assert len(set(ports)) == len(ports)


@pytest.mark.parametrize("raw", ["23000", "23000-22000", "80-9000", "a-b", "20000-70000"])
def test_a_range_that_cannot_be_used_names_its_variable_and_shape(
    monkeypatch: pytest.MonkeyPatch, raw: str
) -> None:
    monkeypatch.setenv(LOCAL_PORTS_ENV, raw)
    with pytest.raises(ValueError, match=f"{LOCAL_PORTS_ENV}=.*'low-high'"):
        free_port()


def test_a_range_with_no_free_port_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        taken = int(s.getsockname()[1])
        monkeypatch.setenv(LOCAL_PORTS_ENV, f"{taken}-{taken + 1}")
        claim_port(taken + 1)
        with pytest.raises(OSError, match=f"no free port on 127.0.0.1 in {LOCAL_PORTS_ENV}"):
            free_port()
