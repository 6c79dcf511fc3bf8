"""fairq's broker: the Redis contract every other part imports.

Settings, API keys, job and request models, the key schema, the Lua scripts,
enqueue/cancel/status, result streams, the Python client and the HTTP gateway.
A service imports the names listed here and the modules of ``FACE``, nothing else of
broker (``tests/test_architecture.py`` holds it): the Lua scripts are called through the
stores' typed wrappers, the transport's lean connection stays inside it, and the settings'
parts are read through ``broker.settings``.
"""

from broker import job_fields, keys, telemetry
from broker.auth import KeyRing, Principal, hash_key
from broker.client import AsyncClient, Client
from broker.dispatching import (
    BandBacklog,
    DispatchStore,
    ExpressSend,
    Grant,
    ModelSnapshot,
    Newcomer,
    express_send,
    parse_wake,
)
from broker.engines import engine_groups
from broker.errors import (
    BodyTooLarge,
    BrokerUnavailable,
    FairqError,
    Forbidden,
    IdempotencyKeyReused,
    IdempotentResultGone,
    InvalidRequest,
    JobFailed,
    NotFound,
    OverQuota,
    QueueFull,
    Unauthorized,
    UnknownModel,
)
from broker.execution import Claimed, ExecutionStore, Outcome, TokenTrail, WrittenEntry
from broker.jobs import JobRecord, JobState, RequestKind, StreamMode, Submission
from broker.lua.dispatch import Pick
from broker.lua.park import Parked
from broker.lua.reclaim import Reclaim
from broker.lua.reroute import Reroute
from broker.lua.unseen import Unseen
from broker.ownership import OwnershipStore
from broker.process.tasks import stop_task, wait_event
from broker.process.uvicorn_server import QuietSignalServer, quiet_config
from broker.queue import JobQueue
from broker.quota_status import QuotaUse, read_quotas
from broker.redis.connect import connect, connect_blocking, lean_link
from broker.results import ResultEvent, ResultReader
from broker.settings import (
    ApiKeyConfig,
    DiscoveryConfig,
    EngineConfig,
    ModelConfig,
    Settings,
    load_settings,
    nameserver_address,
)
from broker.status import (
    DISPATCH_RATE_WINDOW_S,
    BandQueue,
    Latency,
    ModelQueues,
    Snapshot,
    add_latency,
    publish_status,
    read_latencies,
    read_queues,
    read_status,
)
from broker.tiers import ServiceTiers

# The modules of broker a service may import besides this one. A module not named here is
# broker's own until it is.
FACE = (
    "auth",
    "batch",
    "batch.batch_fields",
    "batch.errors",
    "batch.files",
    "batch.lines",
    "batch.reading",
    "batch.store",
    "deadlines",
    "demand",
    "engine_fields",
    "errors",
    "execution",
    "failure_text",
    "idempotency",
    "inspection",
    "job_fields",
    "jobs",
    "keys",
    "position",
    "process.backoff",
    "process.mailbox",
    "process.tasks",
    "process.uvicorn_server",
    "queue",
    "quota_status",
    "quotas",
    "redis.cluster",
    "redis.connect",
    "redis.replies",
    "requests",
    "result_readers",
    "results",
    "settings",
    "status",
    "telemetry",
    "tiers",
)

__all__ = [
    "DISPATCH_RATE_WINDOW_S",
    "ApiKeyConfig",
    "AsyncClient",
    "BandBacklog",
    "BandQueue",
    "BodyTooLarge",
    "BrokerUnavailable",
    "Claimed",
    "Client",
    "DiscoveryConfig",
    "DispatchStore",
    "EngineConfig",
    "ExecutionStore",
    "ExpressSend",
    "FairqError",
    "Forbidden",
    "Grant",
    "IdempotencyKeyReused",
    "IdempotentResultGone",
    "InvalidRequest",
    "JobFailed",
    "JobQueue",
    "JobRecord",
    "JobState",
    "KeyRing",
    "Latency",
    "ModelConfig",
    "ModelQueues",
    "ModelSnapshot",
    "Newcomer",
    "NotFound",
    "Outcome",
    "OverQuota",
    "OwnershipStore",
    "Parked",
    "Pick",
    "Principal",
    "QueueFull",
    "QuietSignalServer",
    "QuotaUse",
    "Reclaim",
    "RequestKind",
    "Reroute",
    "ResultEvent",
    "ResultReader",
    "ServiceTiers",
    "Settings",
    "Snapshot",
    "StreamMode",
    "Submission",
    "TokenTrail",
    "Unauthorized",
    "UnknownModel",
    "Unseen",
    "WrittenEntry",
    "add_latency",
    "connect",
    "connect_blocking",
    "engine_groups",
    "express_send",
    "hash_key",
    "job_fields",
    "keys",
    "lean_link",
    "load_settings",
    "nameserver_address",
    "parse_wake",
    "publish_status",
    "quiet_config",
    "read_latencies",
    "read_queues",
    "read_quotas",
    "read_status",
    "stop_task",
    "telemetry",
    "wait_event",
]
