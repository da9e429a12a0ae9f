"""Per-attempt state: what the middlewares know about the message being processed.

The context lives on the message proxy (so middlewares that run before
the job row is loaded can leave state for it) and, while the actor
runs, in a context variable read by :func:`current_job` and friends.
"""

from __future__ import annotations

import contextvars
import dataclasses
import logging
from typing import TYPE_CHECKING, Any, Optional

from dramatiq_unique.errors import NotInJob
from dramatiq_unique.storage.jobs import PARTIAL
from dramatiq_unique.storage.stores import STORE

if TYPE_CHECKING:
    from dramatiq.broker import MessageProxy

    from dramatiq_unique.storage.models import JobModel
    from dramatiq_unique.suite import ActorConfig, Suite

#: The key of the suite's bookkeeping in ``message.options``.
MARKER = "dramatiq_unique"
#: ``JobContext.extras`` key: callables JobTracking runs when the actor is done, before it
#: records the outcome (a concurrency slot is handed on first: it needs no outcome).
BEFORE_RECORD = "before_record"
#: ``JobContext.extras`` key: the row a woken job's claim already started (prestart.py).
STARTED = "started_row"
#: ``JobContext.extras`` key: set when this delivery is a woken job's message (its marker carried
#: a wake reservation, which the gate's middleware took up).  Only such a delivery may start a
#: row its waker's claim started ahead of it: a copy of the job's first message may not.
WOKEN = "woken"
#: ``JobContext.extras`` key: the fields a retry's send wrote (or meant to write) on the row.
RETRY_FIELDS = "retry_fields"
#: ``JobContext.extras`` key: when (``time.monotonic()``) this delivery asked for its execution lock;
#: the lock's lease runs from then, and a start after it ran out must not draw the key's token.
LOCK_ASKED = "lock_asked"

_ATTRIBUTE = "_dramatiq_unique_context"

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class JobContext:
    """One attempt of one tracked job."""

    suite: "Suite"
    config: "ActorConfig"
    message: "MessageProxy"
    #: The job's row once the attempt has started.
    job: "Optional[JobModel]" = None
    #: Set when Retries re-enqueued the message during this attempt.
    retry_enqueued: bool = False
    #: State other middlewares keep for the attempt (lock tokens, slots).
    extras: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: The job's model in the store that holds its row (:func:`job_model`); set by :func:`attach`.
    model: "Any" = None


_current: contextvars.ContextVar[Optional[JobContext]] = contextvars.ContextVar("dramatiq_unique_job", default=None)


def attach(message: "MessageProxy", suite: "Suite", config: "ActorConfig") -> JobContext:
    """The message's context, made on first use."""
    ctx = getattr(message, _ATTRIBUTE, None)
    if ctx is None:
        ctx = JobContext(suite, config, message, model=job_model(suite, config.model, message.options))
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
        # The start returned only what the middlewares need; read the rest once.  This
        # attempt's own columns (fencing token, checkpoints) stay as the attempt knows them.
        model = type(job)  # in the store that holds the row
        full = model.get_or_none(model.id == job.id)  # type: ignore[union-attr]
        if full is not None:
            full.__data__.update(job.__data__)  # type: ignore[union-attr]
            ctx.job = job = full
    return job  # type: ignore[return-value]


def run_before_record(ctx: JobContext) -> None:
    """Run (once) what other middlewares left to do before the outcome is recorded."""
    for step in ctx.extras.pop(BEFORE_RECORD, ()):
        try:
            step()
        except Exception:  # the outcome must still be written
            logger.exception("A step before recording job %s failed.", ctx.message.message_id)
