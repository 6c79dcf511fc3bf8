"""A private Redis Cluster of a few masters for the tests (and for trying cluster mode).

Each master is a ``LocalRedis`` (the same server binary, loopback only, AOF on)
started with ``--cluster-enabled yes``. The cluster is formed from Python, with
no ``redis-cli --cluster`` needed: each node takes an even share of the 16,384
hash slots (``CLUSTER ADDSLOTSRANGE``), the first node meets the others
(``CLUSTER MEET``), and ``start`` returns once every node reports
``cluster_state:ok`` with all slots covered and every node known. No replicas:
failover is not what the tests exercise.
"""

from __future__ import annotations

import time

import redis

from fairq.stack.localredis import LocalRedis, RedisServerError, free_port

SLOTS = 16384


class LocalCluster:
    """``masters`` private cluster nodes on free loopback ports; use as a context manager."""

    def __init__(self, masters: int = 3, *, node_timeout_ms: int = 5000) -> None:
        if masters < 1:
            raise ValueError("a cluster needs at least one master")
        args = [
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",  # in the node's own directory
            "--cluster-node-timeout",
            str(node_timeout_ms),
        ]
        # The cluster bus port is free too: the default, port + 10000, may be taken or
        # beyond 65535.
        self.bus_ports = [free_port() for _ in range(masters)]
        self.nodes = [
            LocalRedis(extra_args=[*args, "--cluster-port", str(bus)]) for bus in self.bus_ports
        ]

    @property
    def url(self) -> str:
        """A URL of one node: a cluster client discovers the others from it."""
        return self.nodes[0].url

    @property
    def ports(self) -> list[int]:
        return [node.port for node in self.nodes]

    def slot_ranges(self) -> list[tuple[int, int]]:
        """The (first, last) slot each node serves, in node order."""
        share, extra = divmod(SLOTS, len(self.nodes))
        ranges, first = [], 0
        for i in range(len(self.nodes)):
            last = first + share + (1 if i < extra else 0) - 1
            ranges.append((first, last))
            first = last + 1
        return ranges

    def start(self, timeout_s: float = 30.0) -> LocalCluster:
        try:
            for node in self.nodes:
                node.start()
            self._form(timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def _form(self, timeout_s: float) -> None:
        clients = [redis.Redis(port=port, socket_timeout=5) for port in self.ports]
        try:
            for client, (first, last) in zip(clients, self.slot_ranges(), strict=True):
                client.execute_command("CLUSTER", "ADDSLOTSRANGE", first, last)
            for port, bus in zip(self.ports[1:], self.bus_ports[1:], strict=True):
                clients[0].execute_command("CLUSTER", "MEET", "127.0.0.1", port, bus)
            self._wait_ok(clients, timeout_s)
        finally:
            for client in clients:
                client.close()

    def _wait_ok(self, clients: list[redis.Redis], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        want = {"cluster_state": "ok", "cluster_slots_ok": str(SLOTS)}
        want["cluster_known_nodes"] = str(len(self.nodes))
        while time.monotonic() < deadline:
            infos = [_cluster_info(client) for client in clients]
            if all(all(info.get(k) == v for k, v in want.items()) for info in infos):
                return
            time.sleep(0.1)
        raise RedisServerError(f"the local cluster did not reach cluster_state:ok in {timeout_s}s")

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _cluster_info(client: redis.Redis) -> dict[str, str]:
    text = client.execute_command("CLUSTER", "INFO")
    text = text.decode() if isinstance(text, bytes) else str(text)
    return dict(line.split(":", 1) for line in text.split() if ":" in line)
