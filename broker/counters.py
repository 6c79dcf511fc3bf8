"""The counts admission trusts instead of counting jobs, and every script that moves each.

A count read by admission must equal what it counts whatever mix of scripts runs, so each
is moved only by the scripts listed here (Python only reads them). The endpoint counts rise
through prelude.lua's ``send``/``admit`` and fall through its ``release``; a queue's through
``join_queue`` and ``leave_queue``. tests/broker/test_counters.py drives every writer of
every count together against a real Redis and recounts after each step.
"""

WRITERS: dict[str, tuple[str, ...]] = {
    # fq:{m}:inflight, endpoint -> its jobs dispatched or running
    "inflight": ("enqueue", "dispatch", "complete", "cancel", "park", "reroute"),
    # fq:{m}:unstarted, endpoint -> those without a first output ('ft')
    "unstarted": (
        "enqueue",
        "dispatch",
        "first",
        "complete",
        "cancel",
        "park",
        "reroute",
        "reclaim",
    ),
    # fq:{m}:transit, endpoint -> those dispatched and not started by a worker
    "transit": ("enqueue", "dispatch", "start", "complete", "cancel", "park", "reclaim"),
    # fq:{m}:users, user -> their jobs dispatched or running
    "users": ("enqueue", "dispatch", "complete", "cancel", "park", "reroute"),
    # fq:{m}:queued, band -> jobs queued (parked ones included)
    "queued": ("enqueue", "park", "reroute", "dispatch", "cancel", "expire"),
    # meta "tn:{band}:{tenant}" -> the tenant's users backlogged in the band (token-fair)
    "tenants": ("enqueue", "park", "reroute", "dispatch", "cancel", "expire"),
    # meta "xn:{band}", "xsv" -> express sends left under the grant, all and to served users
    "credits": ("grant", "enqueue"),
}
