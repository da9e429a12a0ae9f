"""Dramatiq middlewares for jobs that must not run twice, must not run
too many at once, and must not be lost."""

from typing import TYPE_CHECKING, Any

from dramatiq_unique.api import get_job, redrive, setup, start_redriver, transaction
from dramatiq_unique.checkpoints import checkpoint, step_key
from dramatiq_unique.context import current_job
from dramatiq_unique.durable.dead import cancel_job, dead_jobs, retry_job
from dramatiq_unique.durable.redrive import RedriveCounts
from dramatiq_unique.errors import (
    AmbiguousJobId,
    DatabaseUnavailable,
    DependencyUnavailable,
    DramatiqUniqueError,
    DuplicateJob,
    HookFailed,
    IdempotencyKeyReused,
    InvalidOption,
    JobNotFound,
    JobRejected,
    JobStateError,
    LockLost,
    NotConfigured,
    NotInJob,
    NotSerializable,
    RedisPermissionDenied,
    RedisUnavailable,
    SchemaOutOfDate,
    UnsupportedVersion,
)
from dramatiq_unique.idempotency import submit
from dramatiq_unique.leases import heartbeat
from dramatiq_unique.middleware import ConcurrencySlots, ExecutionLocks, JobTracking, Metrics, Redriver
from dramatiq_unique.observe import enable_metrics
from dramatiq_unique.redis.servers import client_from_url as redis_client
from dramatiq_unique.slots.limits import ConcurrencyStatus, concurrency_status, set_concurrency_limit
from dramatiq_unique.storage.models import JobModel, JobStatus
from dramatiq_unique.suite import Suite
from dramatiq_unique.unique.bulk import send_many

if TYPE_CHECKING:
    from dramatiq_unique.locks.external import lock

__version__ = "0.1.0"

__all__ = [
    "AmbiguousJobId",
    "ConcurrencySlots",
    "ConcurrencyStatus",
    "DatabaseUnavailable",
    "DependencyUnavailable",
    "DramatiqUniqueError",
    "DuplicateJob",
    "ExecutionLocks",
    "HookFailed",
    "IdempotencyKeyReused",
    "InvalidOption",
    "JobModel",
    "JobNotFound",
    "JobRejected",
    "JobStateError",
    "JobStatus",
    "JobTracking",
    "LockLost",
    "Metrics",
    "NotConfigured",
    "NotInJob",
    "NotSerializable",
    "RedisPermissionDenied",
    "RedisUnavailable",
    "RedriveCounts",
    "Redriver",
    "SchemaOutOfDate",
    "Suite",
    "UnsupportedVersion",
    "cancel_job",
    "checkpoint",
    "concurrency_status",
    "current_job",
    "dead_jobs",
    "enable_metrics",
    "get_job",
    "heartbeat",
    "lock",
    "redis_client",
    "redrive",
    "retry_job",
    "send_many",
    "set_concurrency_limit",
    "setup",
    "step_key",
    "submit",
    "start_redriver",
    "transaction",
]


def __getattr__(name: str) -> Any:
    # lock() is imported on first use: importing pottery replaces json.dumps process-wide.
    if name == "lock":
        from dramatiq_unique.locks.external import lock

        globals()["lock"] = lock
        return lock
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
