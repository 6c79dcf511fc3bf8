"""Read-only views of a model's queues for operators (the admin endpoints).

One pipelined read per model: per band the jobs queued, the backlogged users (in
the order the fair pick will serve them) and the users with the most jobs
queued; per endpoint the jobs in flight. The top users are found among the
first ``scan_users`` backlogged users, so a backlog of a million users costs a
bounded read; ``users`` is always exact.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import RedisError

from broker import keys
from broker.errors import BrokerUnavailable


def _int_map(raw: dict[bytes, bytes]) -> dict[str, int]:
    return {k.decode(): int(v) for k, v in raw.items()}


async def model_queue(
    redis: Redis, model: str, bands: Sequence[str], top: int = 10, scan_users: int = 1000
) -> dict[str, Any]:
    """The model's backlog per band (``queued``, ``users``, ``next_users``, ``top_users``)
    and its ``inflight`` and ``unstarted`` jobs per endpoint."""
    try:
        async with redis.pipeline(transaction=False) as pipe:
            pipe.hgetall(keys.queued_counts(model))
            pipe.hgetall(keys.inflight(model))
            pipe.hgetall(keys.unstarted(model))
            for band in bands:
                pipe.zcard(keys.backlog(model, band))
                pipe.zrange(keys.backlog(model, band), 0, scan_users - 1)
            queued, inflight, unstarted, *per_band = await pipe.execute()
            users_of = {band: per_band[2 * i + 1] for i, band in enumerate(bands)}
            for band, users in users_of.items():
                for user in users:
                    pipe.xlen(keys.queue(model, band, user.decode()))
            lengths = iter(await pipe.execute())
    except RedisError as exc:
        raise BrokerUnavailable(f"could not read the queues of model {model!r}: {exc}") from exc
    queued_by_band = _int_map(queued)
    result: dict[str, Any] = {"model": model, "bands": []}
    for i, band in enumerate(bands):
        depth = [(u.decode(), int(next(lengths))) for u in users_of[band]]
        ranked = sorted(depth, key=lambda pair: -pair[1])[:top]
        result["bands"].append(
            {
                "band": band,
                "queued": queued_by_band.get(band, 0),
                "users": int(per_band[2 * i]),
                "next_users": [user for user, _ in depth[:top]],
                "top_users": [{"user": user, "queued": n} for user, n in ranked],
            }
        )
    result["inflight"] = _int_map(inflight)
    result["unstarted"] = _int_map(unstarted)
    return result
