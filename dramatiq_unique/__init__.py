"""Dramatiq middlewares for jobs that must not run twice, must not run
too many at once, and must not be lost."""

from .api import get_job, redrive, setup, start_redriver, transaction
from .checkpoints import checkpoint, step_key
from .config import Suite
from .context import current_job
from .errors import (
    DatabaseUnavailable,
    DependencyUnavailable,
    DramatiqUniqueError,
    DuplicateJob,
    HookFailed,
    IdempotencyKeyReused,
    InvalidOption,
    JobRejected,
    LockLost,
    NotConfigured,
    NotInJob,
    NotSerializable,
    RedisUnavailable,
)
from .heartbeat import heartbeat
from .idempotency import submit
from .limits import ConcurrencyStatus, concurrency_status, set_concurrency_limit
from .middleware import ConcurrencySlots, ExecutionLocks, JobTracking, Redriver
from .models import JobModel, JobStatus
from .redrive import RedriveCounts

__version__ = "0.1.0"

__all__ = [
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
    "JobRejected",
    "JobStatus",
    "JobTracking",
    "LockLost",
    "NotConfigured",
    "NotInJob",
    "NotSerializable",
    "RedisUnavailable",
    "RedriveCounts",
    "Redriver",
    "Suite",
    "checkpoint",
    "concurrency_status",
    "current_job",
    "get_job",
    "heartbeat",
    "redrive",
    "set_concurrency_limit",
    "setup",
    "step_key",
    "submit",
    "start_redriver",
    "transaction",
]
