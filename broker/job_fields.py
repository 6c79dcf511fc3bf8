"""The fields of a job's hash (``fq:{m}:job:{id}``) and of its ready entry, as Redis holds them.

The Lua scripts write these names as literals (a script cannot import); a test holds every
field a script reads or writes on a job hash, and every field of a ready entry, to a name
here (tests/broker/test_job_fields.py). The names are short so that a queued job's hash
stays a small listpack (``broker.keys``, "a queued job's bytes").
"""

# Written at enqueue (enqueue.lua); a queued job's hash holds only these.
STATE = b"st"  # a JobState
USER = b"u"  # the fairness user
OWNER = b"o"  # the API key's user, kept only where it differs from USER
BAND = b"b"
KIND = b"k"  # a RequestKind
STREAM = b"s"  # a StreamMode
COST = b"ce"  # the estimated cost in weighted tokens (token-fair)
WEIGHT = b"w"  # the key's fairness weight, kept only where it is not 1
TENANT_FIELD = b"tnf"  # meta's field counting the tenant's backlogged users
TENANT = b"tn"  # the tenant, in records from before TENANT_FIELD
QUEUE_ENTRY = b"qe"  # the queue entry's id, whose time part is the enqueue time
KEEP_S = b"kt"  # keep the ended job this long (a batch line), not the results' TTL
RESUMABLE = b"rsm"  # 1: may go on from its text if taken back out of the engine
# A job counted by quotas (``broker.quotas``): what it was charged, to settle at its end
QUOTA_CHARGED = b"qc"  # its estimated tokens
QUOTA_MINUTE = b"qm"  # the UTC minute (from the epoch) charged in; absent: a batch line
QUOTA_FIRST = b"q1"  # the key of its first quota's counters
QUOTA_SECOND = b"q2"  # ... and of its second's (a tenant's and a user's)
# Dispatched (dispatch.lua, or enqueue.lua's express send: prelude.lua's send)
QUEUED_MS = b"tq"
DISPATCHED_MS = b"td"
ENDPOINT = b"ep"
READY_ENTRY = b"re"
NEWCOMER = b"nw"  # 1: its user had nothing in the engine
COST_PER_TOKEN = b"cw"  # the token-fair charge per token, corrected to the usage at the end
# Taken back out of the engine (park.lua): queued again
PAYLOAD = b"p"  # the payload, while it is back in the queue
PARKED = b"pk"  # times taken back
PARKED_MID_ANSWER = b"pkm"  # of those, times taken back with output sent: it went on
RESUME_SEQ = b"rsq"  # the generation of the result entry ids its next attempt writes
# Handed back by its worker: its engine never took it (reroute.lua); queued again as above
REROUTES = b"rr"  # times handed back
# Running (start.lua, reclaim.lua, first.lua)
STARTED_MS = b"tr"
WORKER = b"wk"  # the worker running it ('-': none, after park.lua)
ATTEMPTS = b"att"
FIRST_OUTPUT = b"ft"  # set once: the job has left its endpoint's unstarted count
# Ended (complete.lua, cancel.lua, expire.lua: prelude.lua's finish)
FIRST_TOKEN_MS = b"tf"
ENDED_MS = b"te"
ERROR = b"err"  # JSON
USAGE = b"usage"  # JSON
FINISH_REASON = b"fin"
# The gateway's
FOLLOWER = b"cx"  # the number of the newest connection that took up following the job

# A ready entry: PAYLOAD, KIND, STREAM, BAND, USER and ENDPOINT as above, and
JOB_ID = b"j"
ENGINE_PRIORITY = b"pr"  # '' when the engine schedules first come, first served
RESUME_FROM = b"rq"  # RESUME_SEQ, for a job taken back mid-answer
TOKEN_IDS = b"tk"  # 1: record the answer's token ids (a resumable stream: park.lua)
