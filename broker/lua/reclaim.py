"""``reclaim.lua``: take over the ready entries of dead workers and decide each job's fate."""

from __future__ import annotations

import enum
from typing import Any, NamedTuple

from broker import keys
from broker.lua import Call, script
from broker.redis.resp import Arg

_SCRIPT = script("reclaim")


class Reclaim(enum.StrEnum):
    """What was decided for a job taken over from a dead worker."""

    RETRY = "retry"  # no output yet, attempts left: run it again
    FAIL = "fail"  # output was written: end it failed (a retry would repeat text)
    DEAD = "dead"  # started job_max_attempts times: end it as a dead letter


class Taken(NamedTuple):
    decision: Reclaim
    entry_id: bytes
    attempts: int  # times the job was started so far
    fields: dict[bytes, bytes]  # the ready entry's


def reclaim_call(
    model: str, worker: str, *, lease_ms: int, count: int, max_attempts: int
) -> Call[list[Taken]]:
    """Entries idle past ``lease_ms`` (their worker is dead), at most ``count``. Its reply:
    the entries now ``worker``'s; those of ended jobs are removed instead."""
    m = model
    model_keys = [keys.ready(m), keys.unstarted(m), keys.transit(m)]
    args: list[Arg] = [keys.READY_GROUP, worker, lease_ms, count, keys.job_prefix(m)]
    args += [keys.results_prefix(m), max_attempts]
    return Call(_SCRIPT, model_keys, args, _taken)


def _taken(reply: Any) -> list[Taken]:
    return [
        Taken(
            Reclaim(decision.decode()),
            entry_id,
            int(attempts),
            dict(zip(f[::2], f[1::2], strict=True)),
        )
        for decision, entry_id, attempts, f in reply
    ]
