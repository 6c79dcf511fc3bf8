"""The Redis key schema: the one place that builds key strings.

Every key of a model carries the model as a Redis Cluster hash tag
(``fq:{model}:...``) so that each Lua script touches a single slot and models
can spread across cluster shards. Lua scripts never invent key names: they get
keys through KEYS, or a prefix from here through ARGV when the name depends on
data they read (a job id popped from a queue).

    fq:{m}:q:{band}:{user}   stream   a user's queued jobs in one band: id 'j', payload 'p'
    fq:{m}:bk:{band}         zset     backlogged users of a band, score = fairness order
    fq:{m}:meta              hash     per band: fairness clock ("join:{band}") and backlogged
                                      users per tenant ("tn:{band}:{tenant}"); dispatch rate;
                                      the express grant (see GRANT_ENDPOINT) and its sequence
    fq:{m}:job:{id}          hash     the job record (state, owner, times; see below)
    fq:{m}:ready             stream   dispatched jobs, read by workers (consumer group)
    fq:{m}:inflight          hash     endpoint -> jobs dispatched and not yet terminal
    fq:{m}:unstarted         hash     endpoint -> jobs dispatched without a first token yet
    fq:{m}:transit           hash     endpoint -> jobs dispatched and not yet started by a
                                      worker: on their way to the engine (state 'dispatched')
    fq:{m}:handed            zset     "endpoint\njob id" of jobs started in the last second,
                                      score = when (ms): recent enough to be missing from the
                                      engine's metrics
    fq:{m}:users             hash     user -> jobs dispatched and not yet terminal
    fq:{m}:queued            hash     band -> jobs queued
    fq:{m}:out:{id}          stream   the job's result chunks, then an end entry
    fq:{m}:bell:{reader}     stream   wakes a result reader's XREAD (one server: fq:bell:{reader})
    fq:{m}:owner             string   the dispatcher that owns the model (a lease, PX)
    fq:dispatchers           zset     live dispatchers, score = when their heartbeat lapses (ms)
    fq:local-stack           string   in the private Redis of a ``fairq up``: that stack's pid,
                                      gateway and configuration (JSON; ``fairq.stack.owner``)
    fq:{m}:wake              channel  "something changed": new job, freed capacity
    fq:{m}:qf:{band}:{user}  list     jobs taken back out of the engine (park.lua), served
                                      before the user's queue
    fq:{m}:dl:{band}         zset     queued jobs of a band with a deadline of their own,
                                      shorter than the band's (X-Fairq-Max-Queue-S), score =
                                      when it falls (ms); expire.lua drops each once due
    fq:{m}:cancel            channel  job ids cancelled, or taken back, while at a worker
    fq:{m}:dead              zset     dead-lettered job ids, score = when (ms)
    fq:{m}:sweep             string   TTL'd lock: the worker sweeping deadlines now
    fq:{m}:status            string   the dispatcher's status snapshot (JSON, short TTL)
    fq:{m}:lat               stream   recent ended jobs' queue wait and time to first token
                                      (capped; read by the status snapshot's history)
    fq:{m}:idem:{route}:{owner}:{key digest}
                             hash     the job a request's Idempotency-Key made: 'f' the
                                      request's fingerprint, 'j' the job id; written by
                                      enqueue.lua with the job, expires after
                                      idempotency_window_s (``broker.idempotency``)
    fq:idem:{owner}:{route}:{key digest}
                             string   the key's claim, in its owner's slot: the fingerprint
                                      of the request that first sent it (chat, completion),
                                      or "<fingerprint> <id>" of the file or batch it made
    fq:quota:tenant:{tenant} hash     a tenant's quota counters (``broker.quotas``), and
    fq:quota:user:{user}     hash     a user's: the UTC minute and day counted ('mi', 'di':
                                      window numbers) and the tokens and requests of each
                                      ('mt', 'mr', 'dt', 'dr'); a job charged keeps the names
                                      ('qt', 'qu') to settle with at its end. Not a model's:
                                      quotas need a single Redis. Expire after the next day

A queued job's bytes. A million queued jobs must fit in a few hundred MB (at
most 300 bytes per queued job beyond its payload), so while a job is queued its hash holds
only what cannot live elsewhere, all short values, which Redis then keeps as one small
listpack instead of a hash table (a value over ``hash-max-listpack-value``, 64 bytes by
default, would turn the whole hash into a table of ~700 bytes):

    st 'queued'   u user   b band   k kind   s stream flag   ce estimated cost
    tnf the tenant's field of meta (``tenant_field``; the tenant is read back from it)
    qe the queue entry's id, whose time part is the enqueue time (no 'tq' while queued)
    only when not the default: o owner (default: u), w weight (1), kt keep seconds (batch)
    a job counted by quotas: qc its estimated tokens, qm the minute charged (not a batch
    line's), q1 (and q2) its quotas' counters

and a job with a queue deadline of its own has its id in ``fq:{m}:dl:{band}`` besides.

The payload rides in the queue entry and moves to the ready entry at dispatch, which
also records 'tq', 'td', 'ep', 're' (and 'nw' 1 when the user had nothing in the engine:
a newcomer); the later states add their fields (every one named in ``broker.job_fields``).
A job taken back out of the engine (``park.lua``) is queued again with its payload in the
hash ('p'), 'pk' times taken back ('pkm' of those mid-answer), in the list
``fq:{m}:qf:{band}:{user}`` that its user's next pick takes first.

The Batch API (``broker/batch``); a file's and a batch's keys share its id as hash tag:

    fq:file:{id}             hash     a file's metadata (owner, bytes, filename, purpose)
    fq:file:{id}:data        string   the file's bytes
    fq:file:{id}:tmp         string   an output file being written (renamed to :data)
    fq:files:{owner}         zset     the owner's file ids by creation time (ms)
    fq:files:{owner}:held    hash     file id -> bytes, of the files the owner's quota counts;
                                      field '*': their total (``file_reserve.lua``)
    fq:files:{owner}:ends    zset     the same file ids, score = when each stops counting (s):
                                      its expires_at, or an hour on while it is uploaded
    fq:batch:{id}            hash     the batch object, its counters and ingest cursor
    fq:batch:{id}:res        hash     line -> the line's output or error record, until finalize
    fq:batch:{id}:pending    zset     "job id\ncustom_id" of queued/running lines, score = line
    fq:batch:{id}:cids       hash     custom_id -> line (duplicate check, during ingest)
    fq:batch:{id}:lease      string   the RQ job that may advance the batch now (SET NX PX)
    fq:batches:{owner}       zset     the owner's batch ids by creation time (ms)
    fq:batches:active        set      batches not yet in a terminal state (batch workers sweep)

A file's keys expire at its ``expires_at`` (EXPIREAT); its owner's keys hold its share of
the quota until the owner's next upload finds it past its end and releases it.
"""

from __future__ import annotations

READY_GROUP = "workers"


DISPATCHERS = "fq:dispatchers"  # not per model: read and written one command at a time
LOCAL_STACK = "fq:local-stack"  # written by the stack that started this Redis, read by others


def _tag(model: str) -> str:
    return f"fq:{{{model}}}"


def queue(model: str, band: str, user: str) -> str:
    return f"{_tag(model)}:q:{band}:{user}"


def parked_prefix(model: str) -> str:
    """Prefix of the lists of jobs taken back out of the engine (park.lua), per band and
    user: ``<prefix><band>:<user>``; a user's parked jobs are served before their queue."""
    return f"{_tag(model)}:qf:"


def parked(model: str, band: str, user: str) -> str:
    return f"{parked_prefix(model)}{band}:{user}"


def backlog_prefix(model: str) -> str:
    return f"{_tag(model)}:bk:"


def backlog(model: str, band: str) -> str:
    return f"{backlog_prefix(model)}{band}"


def own_deadlines(model: str, band: str) -> str:
    """The band's queued jobs with a deadline of their own (``broker.deadlines``)."""
    return f"{_tag(model)}:dl:{band}"


def meta(model: str) -> str:
    return f"{_tag(model)}:meta"


def join_field(band: str) -> str:
    """Field of ``meta`` holding the score a newly backlogged user joins a band with."""
    return f"join:{band}"


def tenant_field(band: str, tenant: str) -> str:
    """Field of ``meta`` counting a tenant's backlogged users in a band (token-fair)."""
    return f"tn:{band}:{tenant}"


def tenant_of_field(band: str, field: str) -> str:
    """The tenant named by ``tenant_field(band, tenant)`` (a job hash keeps only the field)."""
    return field.removeprefix(f"tn:{band}:")


# The express grant in ``meta``: the dispatcher lets enqueue.lua send up to ``xn:{band}`` new
# jobs straight to endpoint ``xep`` until ``xexp`` (ms), while nothing is queued. ``xs`` counts
# every express send and dispatch, so a grant computed before one of them is refused.
GRANT_ENDPOINT = "xep"
GRANT_EXPIRES = "xexp"
GRANT_SEQUENCE = "xs"


def grant_field(band: str) -> str:
    """Field of ``meta`` holding the express credits left for a band."""
    return f"xn:{band}"


def job_prefix(model: str) -> str:
    return f"{_tag(model)}:job:"


def job(model: str, job_id: str) -> str:
    return job_prefix(model) + job_id


def ready(model: str) -> str:
    return f"{_tag(model)}:ready"


def inflight(model: str) -> str:
    return f"{_tag(model)}:inflight"


def unstarted(model: str) -> str:
    return f"{_tag(model)}:unstarted"


def transit(model: str) -> str:
    return f"{_tag(model)}:transit"


def handed(model: str) -> str:
    return f"{_tag(model)}:handed"


def user_counts(model: str) -> str:
    return f"{_tag(model)}:users"


def queued_counts(model: str) -> str:
    return f"{_tag(model)}:queued"


def results(model: str, job_id: str) -> str:
    return f"{_tag(model)}:out:{job_id}"


def reader_bell(reader_id: str, model: str | None = None) -> str:
    """The stream that wakes one result reader's blocked XREAD (``broker.results``). On a
    cluster it carries the tag of a model its reader follows, so it lives in that slot."""
    return f"{_tag(model)}:bell:{reader_id}" if model is not None else f"fq:bell:{reader_id}"


def owner(model: str) -> str:
    return f"{_tag(model)}:owner"


def wake_channel(model: str) -> str:
    return f"{_tag(model)}:wake"


def cancel_channel(model: str) -> str:
    return f"{_tag(model)}:cancel"


def queue_prefix(model: str, band: str) -> str:
    """``queue(model, band, user)`` without the user: for scripts that walk a backlog."""
    return f"{_tag(model)}:q:{band}:"


def results_prefix(model: str) -> str:
    return f"{_tag(model)}:out:"


def dead_letters(model: str) -> str:
    return f"{_tag(model)}:dead"


def sweep_lock(model: str) -> str:
    return f"{_tag(model)}:sweep"


def idempotent_job(model: str, route: str, owner: str, key_digest: str) -> str:
    """The job an Idempotency-Key made on a route, in the model's slot (enqueue.lua's)."""
    return f"{_tag(model)}:idem:{route}:{owner}:{key_digest}"


def idempotency_claim(owner: str, route: str, key_digest: str) -> str:
    """An Idempotency-Key's claim, in its owner's slot: one key per owner and route,
    whatever the model, so the same key with another model is seen as reused."""
    return f"fq:idem:{{{owner}}}:{route}:{key_digest}"


def tenant_quota(tenant: str) -> str:
    """A tenant's quota counters (``broker.quotas``)."""
    return f"fq:quota:tenant:{{{tenant}}}"


def user_quota(user: str) -> str:
    """A user's quota counters (``broker.quotas``)."""
    return f"fq:quota:user:{{{user}}}"


def job_pattern(model: str) -> str:
    """SCAN pattern matching every job hash of a model (operator tools only: it scans)."""
    return job_prefix(model) + "*"


# The status snapshot lives a few publish intervals: a dead dispatcher's view soon vanishes.
STATUS_TTL_S = 10
LATENCY_MAXLEN = 2000  # ended jobs kept in ``latencies`` (approximate trimming)


def status(model: str) -> str:
    return f"{_tag(model)}:status"


def latencies(model: str) -> str:
    return f"{_tag(model)}:lat"


def file_meta(file_id: str) -> str:
    return f"fq:file:{{{file_id}}}"


def file_data(file_id: str) -> str:
    return f"fq:file:{{{file_id}}}:data"


def file_tmp(file_id: str) -> str:
    return f"fq:file:{{{file_id}}}:tmp"


def owner_files(owner: str) -> str:
    return f"fq:files:{{{owner}}}"


def owner_files_held(owner: str) -> str:
    return f"fq:files:{{{owner}}}:held"


def owner_files_ends(owner: str) -> str:
    return f"fq:files:{{{owner}}}:ends"


def batch(batch_id: str) -> str:
    return f"fq:batch:{{{batch_id}}}"


def batch_results(batch_id: str) -> str:
    return f"{batch(batch_id)}:res"


def batch_pending(batch_id: str) -> str:
    return f"{batch(batch_id)}:pending"


def batch_custom_ids(batch_id: str) -> str:
    return f"{batch(batch_id)}:cids"


def batch_lease(batch_id: str) -> str:
    return f"{batch(batch_id)}:lease"


def owner_batches(owner: str) -> str:
    return f"fq:batches:{{{owner}}}"


ACTIVE_BATCHES = "fq:batches:active"
BATCH_QUEUE = "fairq-batch"  # the RQ queue of batch work
