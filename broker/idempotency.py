"""``Idempotency-Key``: a request sent again gets what its first try made, never a second.

A client whose request got no answer (its connection broke, its gateway died) cannot
tell whether the request was accepted. It sends the request again with the key it sent
the first time and gets the same job (a stream replayed from its start, or from
``Last-Event-ID``), the same file or the same batch, within ``idempotency_window_s``.

What a key is, and what it is compared with:

* 1 to ``MAX_KEY_CHARS`` printable ASCII characters (``check_key``; a UUID is a good
  key). Redis holds only its SHA-256, so no caller's text reaches a key name;
* scoped to the API key's user (the job's owner: a trusted app's end users share the
  app's keys, as they share its API key) and to the route (``ROUTES``): the same key on
  two routes is two keys, as two endpoints' requests can never be the same request;
* the request's ``Fingerprint`` hashes its canonical form: the body as JSON with sorted
  keys (whitespace and key order do not count), plus what else decides the work (the
  band header; a file's purpose, name and bytes). The same key with another fingerprint
  is a 409 ``idempotency_key_reused``: a key stands for one request. A request's own
  queue deadline (``X-Fairq-Max-Queue-S``) is not in it: it says how long to wait,
  counted from the first try, not what to run, so a retry gets the first try's job with
  the first try's deadline, whatever it sends (``broker.deadlines``).

Where it lives (``broker.keys``), and why a job's key is written twice:

* the **claim** ``fq:idem:{owner}:<route>:<key>``, in its owner's slot: set (NX) by the
  first request with the key, it holds that request's fingerprint, and another request
  with the key is refused there, whatever its model (``bind``);
* the **job record** ``fq:{m}:idem:<route>:<owner>:<key>``, in the model's slot, is
  written by ``enqueue.lua`` in the call that makes the job: two tries at once (two
  gateways, a retry while the first try still waits) can never make two jobs, the second
  gets the first's id. A cluster runs a script in one slot, the model's, hence two keys:
  the claim sees a key reused with another model, the record makes the job once. A try
  that died between the two left a claim and no job: its retry makes the job.
* a file's or a batch's claim holds ``"<fingerprint> <id>"`` and is written in the
  transaction that stores the file or batch (``create_once``; the Batch API runs on one
  Redis, so a transaction may span their keys).

Both expire after the window. A key whose job ended and expired (``result_ttl_s``), or
whose file was deleted, answers 410 ``idempotent_result_expired``: it never makes a
second job in the first one's place.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass

import orjson
from redis.asyncio import Redis
from redis.asyncio.client import Pipeline
from redis.exceptions import RedisError, WatchError

from broker import keys
from broker.errors import (
    BrokerUnavailable,
    IdempotencyKeyReused,
    IdempotentResultGone,
    InvalidRequest,
)

HEADER = "Idempotency-Key"
MAX_KEY_CHARS = 255  # Stripe's bound; a UUID is 36
# The routes that create work, each a scope of its own. POST /v1/responses, once fairq
# serves it, adds "responses" here and calls FollowedJob.submit_once as completions do.
ROUTES = ("chat", "completion", "embedding", "response", "files", "batches")
_DIGEST_CHARS = 32  # hex digits of SHA-256 kept: 128 bits, for keys and fingerprints alike


def check_key(value: str) -> str:
    """The key as sent, or InvalidRequest (400) saying what a key must be."""
    what = f"send 1 to {MAX_KEY_CHARS} printable ASCII characters (a UUID is a good key)"
    if not value:
        raise _bad_key(f"{HEADER} is empty: {what}, or leave the header out")
    if len(value) > MAX_KEY_CHARS:
        raise _bad_key(f"{HEADER} is {len(value)} characters long: {what}")
    if not (value.isascii() and value.isprintable()):
        raise _bad_key(f"{HEADER} holds a control or non-ASCII character: {what}")
    return value


def _bad_key(message: str) -> InvalidRequest:
    return InvalidRequest(message, code="invalid_idempotency_key")


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:_DIGEST_CHARS]


class Fingerprint:
    """A request's fingerprint: the SHA-256 of its canonical parts, then of any bytes
    ``add``-ed (a file's content, block by block, never held whole)."""

    __slots__ = ("_hash",)

    def __init__(self, route: str, *parts: object) -> None:
        # Sorted keys at every depth: the same request sent again by another client
        # library, or with its fields in another order, has the same fingerprint.
        self._hash = hashlib.sha256(orjson.dumps([route, *parts], option=orjson.OPT_SORT_KEYS))

    def add(self, data: bytes) -> None:
        self._hash.update(data)

    def hexdigest(self) -> str:
        return self._hash.hexdigest()[:_DIGEST_CHARS]


def fingerprint(route: str, *parts: object) -> str:
    """The fingerprint of a request made of JSON values (a body, a header's value)."""
    return Fingerprint(route, *parts).hexdigest()


@dataclass(frozen=True, slots=True)
class Idempotency:
    """A request's Idempotency-Key, scoped to its owner and route, with its fingerprint."""

    owner: str
    route: str
    key_digest: str
    fingerprint: str
    window_s: int

    @classmethod
    def of(
        cls, key: str, *, owner: str, route: str, fingerprint: str, window_s: int
    ) -> Idempotency:
        """``key`` as the client sent it (checked here: InvalidRequest if it is not one)."""
        assert route in ROUTES, f"{route!r} is not a route that creates work"
        return cls(owner, route, _digest(check_key(key).encode()), fingerprint, window_s)

    @property
    def claim(self) -> str:
        return keys.idempotency_claim(self.owner, self.route, self.key_digest)

    def job_record(self, model: str) -> str:
        return keys.idempotent_job(model, self.route, self.owner, self.key_digest)


def reused(once: Idempotency) -> IdempotencyKeyReused:
    return IdempotencyKeyReused(
        f"this {HEADER} was used with a different request (another body, model or band) "
        f"within the last {_duration(once.window_s)}: a key stands for one request. Send "
        "this request with a new key, or the first request again to get its answer"
    )


def job_gone(job_id: str) -> IdempotentResultGone:
    return IdempotentResultGone(
        f"the request with this {HEADER} ran as job {job_id}, which has ended, and its "
        "result is no longer kept (result_ttl_s); it is not run a second time: send the "
        "request with a new key to run it again"
    )


def object_gone(kind: str, object_id: str) -> IdempotentResultGone:
    return IdempotentResultGone(
        f"the {kind} this {HEADER} created ({object_id}) no longer exists; send the "
        f"request with a new key to create another {kind}"
    )


def _duration(seconds: int) -> str:
    return f"{seconds // 3600} h" if seconds % 3600 == 0 else f"{seconds} s"


async def bind(redis: Redis, once: Idempotency) -> None:
    """Claim the key for this request's fingerprint, or check that it holds it already;
    IdempotencyKeyReused when the key is another request's. The job itself is made once
    by enqueue.lua (the job record), not here."""
    try:
        if await redis.set(once.claim, once.fingerprint, nx=True, ex=once.window_s):
            return
        bound = await redis.get(once.claim)
    except RedisError as exc:
        raise BrokerUnavailable(f"could not check the {HEADER}: {exc}") from exc
    # None: it expired between the two calls, and this request's try now holds the window.
    if bound is not None and _made_by(bound, once) is None:
        raise reused(once)


def _made_by(value: bytes | str, once: Idempotency) -> str | None:
    """The id a claim records ('' for a job's claim), or None when it is another request's."""
    text = value.decode() if isinstance(value, bytes) else value
    claimed_by, _, made = text.partition(" ")
    return made if claimed_by == once.fingerprint else None


async def made(redis: Redis, once: Idempotency) -> str | None:
    """The id of the file or batch the key made, or None when it made none yet;
    IdempotencyKeyReused when the key is another request's."""
    value = await redis.get(once.claim)
    return None if value is None else _checked(value, once)


def _checked(value: bytes | str, once: Idempotency) -> str:
    made = _made_by(value, once)
    if made is None:
        raise reused(once)
    return made


async def create_once(
    redis: Redis, once: Idempotency, new_id: str, writes: Callable[[Pipeline], None]
) -> tuple[str, bool]:
    """Queue ``writes`` (the commands that store ``new_id``) in one transaction with the
    key's claim, unless the key has a claim: (the id the key made, whether it was now).

    The claim is WATCHed between its read and the transaction: another request's claim
    written in between aborts this one (``WatchError``), and the next read finds it, so
    of two requests at once exactly one stores its object.
    """
    async with redis.pipeline(transaction=True) as pipe:
        while True:
            try:
                await pipe.watch(once.claim)
                value = await pipe.get(once.claim)
                if value is not None:
                    return _checked(value, once), False
                pipe.multi()
                writes(pipe)
                pipe.set(once.claim, f"{once.fingerprint} {new_id}", ex=once.window_s)
                await pipe.execute()
                return new_id, True
            except WatchError:
                continue
