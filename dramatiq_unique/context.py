"""Per-attempt state: what the middlewares know about the message being processed, on the message proxy
and, while the actor runs, in a context variable read by :func:`current_job` and friends."""

from __future__ import annotations

import contextvars
import dataclasses
import logging
import time
from typing import TYPE_CHECKING, Any, Callable, NoReturn, Optional

from dramatiq_unique.errors import LockLost, NotInJob
from dramatiq_unique.observe import events
from dramatiq_unique.storage.jobs import PARTIAL
from dramatiq_unique.storage.stores import STORE

if TYPE_CHECKING:
    from dramatiq.broker import MessageProxy

    from dramatiq_unique.parking.groups import Gate
    from dramatiq_unique.storage.models import JobModel
    from dramatiq_unique.suite import ActorConfig, Suite

#: The key of the suite's bookkeeping in ``message.options``.
MARKER = "dramatiq_unique"

_ATTRIBUTE = "_dramatiq_unique_context"

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class Held:
    """A gate held by one attempt; :meth:`renew` is its ``heartbeat()`` renewer."""

    gate: "Gate"
    group: str
    token: str
    ttl_ms: float
    #: The limit it entered under (a slot group's; -1: none).
    limit: int = -1

    def renew(self) -> float:
        """Extend the lease to a full ``ttl_ms``; the seconds left."""
        started = time.monotonic()
        if not self.gate.renew(self.group, self.token, self.ttl_ms, self.limit):
            raise LockLost(self.gate.lost.format(self.group))
        return self.ttl_ms / 1000 - (time.monotonic() - started)


@dataclasses.dataclass
class JobContext:
    """One attempt of one tracked job."""

    suite: "Suite"
    #: The actor's options, with the message's own over them (:meth:`ActorConfig.for_message`).
    config: "ActorConfig"
    message: "MessageProxy"
    #: The job's row once the attempt has started.
    job: "Optional[JobModel]" = None
    #: Set when Retries re-enqueued the message during this attempt.
    retry_enqueued: bool = False
    #: The job's model in the store that holds its row (:func:`job_model`); set by :func:`attach`.
    model: "Any" = None
    #: The gates the attempt holds, by kind ("lock", "slot"): parking/groups.py.
    held: dict[str, Held] = dataclasses.field(default_factory=dict)
    #: Run when the actor is done, before the outcome is recorded (a slot is handed on first).
    before_record: list[Callable[[], None]] = dataclasses.field(default_factory=list)
    #: The LockLost that ended the attempt's hold: it is not recorded as succeeded.
    lock_lost: Optional[LockLost] = None
    #: time.monotonic() of the last write of the row's lease (leases.py).
    lease_written: Optional[float] = None
    #: The unique key whose fencing token the start draws (an execution lock is held).
    fence_key: Optional[str] = None
    #: time.monotonic() when the delivery asked for its execution lock, whose lease runs from then.
    lock_asked: Optional[float] = None
    #: The row a woken job's claim already started (parking).
    started: "Optional[JobModel]" = None
    #: This delivery is a woken job's message: only it may start a row its waker's claim started.
    woken: bool = False
    #: The fields a retry's send wrote (or meant to write) on the row.
    retry_fields: dict[str, Any] = dataclasses.field(default_factory=dict)

    def fail(self, error: LockLost | str) -> NoReturn:
        """Raise LockLost, remembered first: the attempt lost its hold and must not be recorded as succeeded."""
        error = LockLost(error) if isinstance(error, str) else error
        self.lock_lost = error
        events.lock_lost(self.job, error)
        raise error


_current: contextvars.ContextVar[Optional[JobContext]] = contextvars.ContextVar("dramatiq_unique_job", default=None)


def attach(message: "MessageProxy", suite: "Suite", config: "ActorConfig") -> JobContext:
    """The message's context, made on first use."""
    ctx = getattr(message, _ATTRIBUTE, None)
    if ctx is None:
        ctx = JobContext(suite, config.for_message(message.options), message,
                         model=job_model(suite, config.model, message.options))
        setattr(message, _ATTRIBUTE, ctx)
    return ctx


def store_of(options: dict) -> int:
    """The store that holds the row of the job whose message has ``options`` (0: the primary)."""
    marker = options.get(MARKER)
    return int(marker.get(STORE, 0)) if marker else 0


def job_model(suite: "Suite", model: "type[JobModel]", options: dict) -> "type[JobModel]":
    """``model`` in the store that holds the row of the job whose message has ``options``."""
    index = store_of(options)
    return model if index == 0 else suite.stores.model_in(model, index)


def of(message: Any) -> Optional[JobContext]:
    return getattr(message, _ATTRIBUTE, None)


def activate(ctx: Optional[JobContext]) -> None:
    _current.set(ctx)


def active() -> Optional[JobContext]:
    return _current.get()


def require() -> JobContext:
    ctx = _current.get()
    if ctx is None or ctx.job is None:
        raise NotInJob()
    return ctx


def current_job() -> "JobModel":
    """Inside an actor: the current job's row."""
    ctx = require()
    job = ctx.job
    if getattr(job, PARTIAL, False):
        # The start returned only what the middlewares need: the rest read once, the attempt's own columns kept.
        model = type(job)  # in the store that holds the row
        full = model.get_or_none(model.id == job.id)  # type: ignore[union-attr]
        if full is not None:
            full.__data__.update(job.__data__)  # type: ignore[union-attr]
            ctx.job = job = full
    return job  # type: ignore[return-value]


def run_before_record(ctx: JobContext) -> None:
    """Run (once) what other middlewares left to do before the outcome is recorded."""
    steps, ctx.before_record = ctx.before_record, []
    for step in steps:
        try:
            step()
        except Exception:  # the outcome must still be written
            logger.exception("A step before recording job %s failed.", ctx.message.message_id)
