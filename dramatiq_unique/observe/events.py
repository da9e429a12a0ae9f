"""The events the suite observes: one hook per event, writing its log line and moving its metric.

Hooks never raise and import nothing of the suite, so every module may call them; with metrics
off a hook reads one global.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, Mapping, Optional, TypeVar

if TYPE_CHECKING:
    from dramatiq_unique.observe.metrics import SuiteMetrics

#: The logger of every line below: route or filter the suite's events by this one name.
logger = logging.getLogger("dramatiq_unique.events")

#: The names of the ``extra=`` fields of every line below (a log record's attributes).
JOB_ID, ACTOR, UNIQUE_KEY = "job_id", "actor", "unique_key"
#: A duplicate's line: the job that holds the key.
EXISTING_JOB_ID = "existing_job_id"
#: A duplicate's line: "skip", "raise" or "replace" (the values of ``unique_on_conflict``).
DECISION = "decision"

#: The key, in a parked job's marker, of the time it parked (epoch ms): a wait's duration.
PARKED_AT = "pk"
#: The key, in a wake-up's reservation, of the time the gate was handed on (epoch ms).
HANDED_AT = "ts"

E = TypeVar("E", bound=BaseException)

#: The metrics of this process, shared by every suite in it (prometheus_client refuses a metric
#: registered twice); None while metrics are off.  Set by :func:`~dramatiq_unique.observe.enable_metrics`.
sink: "Optional[SuiteMetrics]" = None

_DUPLICATE = {
    "skip": "Duplicate %s job %s skipped: job %s holds its key%s.",
    "raise": "Duplicate %s job %s refused with DuplicateJob: job %s holds its key%s.",
    "replace": "Duplicate %s job %s replaced the arguments of waiting job %s%s.",
}


def fields(job_id: Any, actor: Any, key: Optional[str] = None, **more: Any) -> dict[str, Any]:
    """The ``extra=`` of a log line about a job: its id, actor and unique key, and ``more``."""
    return {JOB_ID: job_id, ACTOR: actor, UNIQUE_KEY: key, **more}


def now_ms() -> int:
    """Epoch ms: the stamps of :data:`PARKED_AT` and :data:`HANDED_AT` (read in other processes)."""
    return int(time.time() * 1000)


def duplicate(decision: str, message: Any, existing_id: str, key: Optional[str], why: str = "") -> None:
    """A unique send met a job holding its key and ``decision`` was taken: one INFO line that names
    both job ids (the new send's message id and the existing job's), and the decision's counter."""
    if logger.isEnabledFor(logging.INFO):
        logger.info(_DUPLICATE[decision], message.actor_name, message.message_id, existing_id,
                    f" ({why})" if why else "",
                    extra=fields(message.message_id, message.actor_name, key,
                                 **{EXISTING_JOB_ID: existing_id, DECISION: decision}))
    if (on := sink) is not None:
        on.inc(on.duplicates, message.queue_name, message.actor_name, decision)


def parked(gate: str, message: Any, group: str) -> None:
    """A job parked on ``group`` of a ``gate`` ("lock" or "slot"): a wait begins."""
    actor = getattr(message, "actor_name", None)
    if logger.isEnabledFor(logging.DEBUG):
        logger.debug("Job %s parked on %s.", message.message_id, group, extra=fields(message.message_id, actor))
    if (on := sink) is not None:
        on.inc(on.waits, getattr(message, "queue_name", None), actor, gate)


def taken_up(gate: str, message: Any, marker: Mapping[str, Any], wake: Mapping[str, Any]) -> None:
    """A woken job took up the gate handed to it: its wait (since it parked) and the hand-over
    (since the gate was handed on) end here."""
    if (on := sink) is not None:
        on.taken_up(getattr(message, "queue_name", None), getattr(message, "actor_name", None), gate,
                    marker.get(PARKED_AT), wake.get(HANDED_AT))


def parked_counts(counts: Mapping[tuple[str, str], int]) -> None:
    """The parked jobs now, by (actor, gate), counted by a re-drive pass."""
    if (on := sink) is not None:
        on.parked_counts(counts)


def heartbeat(job: Any) -> None:
    """``heartbeat()`` renewed a job's leases."""
    if (on := sink) is not None:
        on.inc(on.heartbeats, job.queue_name, job.actor_name)


def lock_lost(job: Any, error: E) -> E:
    """A running job learned that its lock or lease is gone (``LockLost``): a WARNING, counted.
    Returns ``error``, so a call site can ``raise events.lock_lost(job, LockLost(...))``."""
    job_id, actor = (job.message_id, job.actor_name) if job is not None else ("?", None)
    logger.warning("Job %s (%s) lost its lease: %s", job_id, actor, getattr(error, "detail", error),
                   extra=fields(job_id, actor, getattr(job, "unique_key", None)))
    if (on := sink) is not None:
        on.inc(on.locks_lost, getattr(job, "queue_name", None), actor)
    return error


def fenced_out(job: Any, write: str) -> None:
    """A write of an attempt (``write``: "outcome", "checkpoint" or "lease") was refused by its
    fencing token: a newer attempt owns the row.  A WARNING, counted."""
    logger.warning("Job %s (%s) was taken over by a newer attempt; its %s write was refused by the fencing "
                   "token %s.", job.message_id, job.actor_name, write, job.fencing_token,
                   extra=fields(job.message_id, job.actor_name, job.unique_key))
    if (on := sink) is not None:
        on.inc(on.fenced, job.queue_name, job.actor_name, write)


def job_lost(row: Any, where: str, then: str) -> None:
    """The re-drive confirmed a job lost (its message is in none of the broker's queues): a WARNING.
    ``then`` says what follows ("sent again"; a job marked failed has its own line)."""
    logger.warning("Job %s (%s) lost while %s: %s.", row.message_id, row.actor_name, where, then,
                   extra=fields(row.message_id, row.actor_name, row.unique_key))


def job_failed(row: Any, reason: str) -> None:
    """The re-drive marked a job failed (lost under ``on_lost="fail"``, retries exhausted, dead-lettered)."""
    logger.warning("Job %s (%s) marked failed: %s.", row.message_id, row.actor_name, reason,
                   extra=fields(row.message_id, row.actor_name, row.unique_key))


def redrive_pass(counts: Any) -> None:
    """A re-drive pass ended with ``counts`` (a :class:`RedriveCounts`)."""
    if (on := sink) is not None and counts.ran:
        on.redrive_pass(counts.as_dict())
