"""Dramatiq middlewares for jobs that must not run twice, must not run
too many at once, and must not be lost."""

from typing import TYPE_CHECKING, Any, Optional, Union

import peewee as pw
from dramatiq import Broker
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import Retries

from dramatiq_unique import suite as _suite
from dramatiq_unique.context import checkpoint, current_job, heartbeat, step_key
from dramatiq_unique.durable.dead import cancel_job, dead_jobs, retry_job
from dramatiq_unique.durable.lookup import find_job
from dramatiq_unique.durable.redrive import RedriveCounts, redrive, start_redriver
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
from dramatiq_unique.logs import RedactPasswords, ResultWarningFilter
from dramatiq_unique.middleware import ConcurrencySlots, ExecutionLocks, JobTracking, Metrics, Reclaimer, Redriver
from dramatiq_unique.observe import enable_metrics
from dramatiq_unique.redis.servers import check_redis
from dramatiq_unique.redis.servers import client_from_url as redis_client
from dramatiq_unique.slots.limits import ConcurrencyStatus, concurrency_status, set_concurrency_limit
from dramatiq_unique.storage.models import JobModel, JobStatus
from dramatiq_unique.suite import RedisSpec, Suite
from dramatiq_unique.unique.bulk import send_many
from dramatiq_unique.unique.send import submit, transaction, uninstall_enqueue

if TYPE_CHECKING:
    from dramatiq_unique.locks.external import lock

__version__ = "0.1.0"

__all__ = [
    "AmbiguousJobId", "ConcurrencySlots", "ConcurrencyStatus", "DatabaseUnavailable", "DependencyUnavailable",
    "DramatiqUniqueError", "DuplicateJob", "ExecutionLocks", "HookFailed", "IdempotencyKeyReused", "InvalidOption",
    "JobModel", "JobNotFound", "JobRejected", "JobStateError", "JobStatus", "JobTracking", "LockLost", "Metrics",
    "NotConfigured", "NotInJob", "NotSerializable", "Reclaimer", "RedisPermissionDenied", "RedisUnavailable",
    "RedriveCounts",
    "Redriver", "SchemaOutOfDate", "Suite", "UnsupportedVersion", "cancel_job", "checkpoint", "concurrency_status",
    "current_job", "dead_jobs", "enable_metrics", "get_job", "heartbeat", "lock", "redis_client", "redrive",
    "retry_job", "send_many", "set_concurrency_limit", "setup", "step_key", "submit", "start_redriver", "transaction",
]


def setup(broker: Broker, *, database: Union[str, pw.Database], redis: RedisSpec, **settings: Any) -> Suite:
    """Add the suite's middlewares to ``broker`` and create the job tables.

    Declare actors after this call: Dramatiq checks actor options against
    the middlewares present when an actor is declared.  Returns the
    :class:`Suite`; the last call's suite is the one module-level
    functions such as :func:`get_job` use.  Called again on the same
    broker (an app factory, a test's fixture), it replaces the earlier
    suite there: its middlewares go, and the actors already declared are
    the new suite's (the earlier suite is not closed).  ``database`` may also be a
    sync SQLAlchemy ``Engine`` on PostgreSQL: sends inside its sessions'
    ``session.begin()`` then commit with them (docs: SQLAlchemy how-to).

    Checks its services once: the database (connecting, creating the
    tables) and each Redis server, the broker's too, raising
    :class:`DependencyUnavailable` (``DatabaseUnavailable``,
    ``RedisUnavailable``) naming the one that did not answer, within the
    ``database_connect_timeout`` and ``check_timeout`` settings (with
    several Redlock masters, a majority must answer; ``check_redis=False``
    skips the Redis check).
    """
    RedactPasswords.install()  # before the set-up's own warnings (a store down)
    if type(database).__module__.startswith("sqlalchemy."):  # an Engine: sends follow its sessions
        from dramatiq_unique.contrib.sqlalchemy import EngineDatabase

        database = EngineDatabase.of(database)
    suite = Suite(database=database, redis=redis, **settings)
    if suite.settings.check_redis:
        try:
            check_redis(suite.masters, getattr(broker, "client", None), suite.settings.check_timeout)
        except BaseException:
            suite.close()
            raise
    suite.broker = broker
    _detach(broker)
    retries = any(isinstance(m, Retries) for m in broker.middleware)
    # Before Retries: our after_process_message then runs after it has decided.
    tracking = JobTracking(suite=suite)
    broker.add_middleware(tracking, **({"before": Retries} if retries else {}))
    # Before JobTracking: the lock is taken before the row is marked running,
    # and handed on after the outcome is recorded.
    broker.add_middleware(ExecutionLocks(suite=suite), before=JobTracking)
    # Before ExecutionLocks: a job takes its slot, then its lock; hands on the lock, then the slot.
    broker.add_middleware(ConcurrencySlots(suite=suite), before=ExecutionLocks)
    broker.add_middleware(Redriver(suite=suite))  # starts the re-drive after worker boot if `redriver`
    if not any(isinstance(m, Metrics) for m in broker.middleware):  # metrics at worker boot, one per broker
        broker.add_middleware(Metrics())
    if isinstance(broker, RedisBroker) and not any(isinstance(m, Reclaimer) for m in broker.middleware):
        # First: a message counts as held by a worker thread from the first hook on.
        first = {"before": type(broker.middleware[0])} if broker.middleware else {}
        broker.add_middleware(Reclaimer(), **first)
    ResultWarningFilter.install(suite)
    attach = getattr(suite.db, "attach_suite", None)
    if attach is not None:  # a framework's database (dramatiq_unique.contrib): its transactions hold sends
        attach(suite)
    for actor in list(broker.actors.values()):  # declared under an earlier setup() of this broker: now this suite's
        tracking.before_declare_actor(broker, actor)
    return suite


def _detach(broker: Broker) -> None:
    """Take an earlier suite's middlewares and send path off ``broker``: setup() called again on one broker
    (an app factory, a test's fixture) replaces the suite, where two sets of hooks would each act on every job."""
    broker.middleware[:] = [m for m in broker.middleware
                            if not isinstance(m, (JobTracking, ExecutionLocks, ConcurrencySlots, Redriver))]
    uninstall_enqueue(broker)


def get_job(
    id_or_message_id: Union[int, str], *, model: Optional[type[JobModel]] = None, store: Optional[int] = None,
) -> Optional[JobModel]:
    """A job's row by message id (any job table) or numeric id (``model``, the shared table by default).

    With several job stores, a message id is looked up in every store (``store``: in that one);
    a numeric id is the primary's, unless ``store`` names another.  A store that does not answer
    is skipped, but a job found in none of the others then raises ``DatabaseUnavailable``: it may be
    in that store.

    Only a job of this suite's app (or one written before rows had an app): in a database
    that several apps share, another app's job is None, as a job that does not exist.
    """
    return find_job(_suite.current(), id_or_message_id, model=model, store=store)


def __getattr__(name: str) -> Any:
    # lock() is imported on first use: importing pottery replaces json.dumps process-wide.
    if name == "lock":
        from dramatiq_unique.locks.external import lock

        globals()["lock"] = lock
        return lock
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
