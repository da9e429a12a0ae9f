"""The events the suite observes: one hook per event, writing its log line and moving its metric (bounded labels,
never a key nor a job id).  Hooks never raise and import nothing of the suite; with metrics off, one global read."""

from __future__ import annotations

import functools
import logging
import time
from typing import Any, Callable, Mapping, Optional, TypeVar

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
#: Every metric's name starts with this.
PREFIX = "dramatiq_unique_"
#: Buckets (seconds) of how long a parked job waited for its lock or slot.
WAIT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600, float("inf"))
#: Buckets (seconds) of a hand-over: from a gate handed on to the woken job taking it up.
HANDOVER_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 60, float("inf"))

E = TypeVar("E", bound=BaseException)
F = TypeVar("F", bound=Callable[..., None])

#: The metrics of this process, shared by every suite in it (prometheus_client refuses a metric
#: registered twice); None while metrics are off.  Set by :func:`~dramatiq_unique.observe.enable_metrics`.
sink: "Optional[SuiteMetrics]" = None

_DUPLICATE = {
    "skip": "Duplicate %s job %s skipped: job %s holds its key%s.",
    "raise": "Duplicate %s job %s refused with DuplicateJob: job %s holds its key%s.",
    "replace": "Duplicate %s job %s replaced the arguments of waiting job %s%s.",
}


def fields(job_id: Any, actor: Any, key: Optional[str] = None, **more: Any) -> dict[str, Any]:  # a line's extra=
    return {JOB_ID: job_id, ACTOR: actor, UNIQUE_KEY: key, **more}


def now_ms() -> int:  # epoch ms, not monotonic: PARKED_AT and HANDED_AT are read in other processes
    return int(time.time() * 1000)


#: Options Dramatiq's middlewares act on once a message's job is done (Pipelines, GroupCallbacks, Callbacks):
#: a skipped duplicate's never runs, so what they carry is dropped with it.
CONTINUATIONS = ("pipe_target", "group_completion_callbacks", "on_success", "on_failure")


def duplicate(decision: str, message: Any, existing_id: str, key: Optional[str], why: str = "") -> None:
    """A unique send met a job holding its key: an INFO line naming both job ids, and the decision counted;
    a WARNING if a skipped one carried a continuation (a pipeline's next step, a group's callbacks)."""
    dropped = [name for name in CONTINUATIONS if message.options.get(name)] if decision == "skip" else []
    if dropped:
        logger.warning(
            "Job %s of %s is a duplicate of job %s and was not sent, so what it carried for after its job "
            "(%s) will not run: a pipeline stops there, a group never completes (unique_on_conflict='raise' "
            "makes such a send raise instead).",
            message.message_id, message.actor_name, existing_id, ", ".join(dropped),
            extra=fields(message.message_id, message.actor_name, key, **{EXISTING_JOB_ID: existing_id}))
    if logger.isEnabledFor(logging.INFO):
        logger.info(_DUPLICATE[decision], message.actor_name, message.message_id, existing_id,
                    f" ({why})" if why else "",
                    extra=fields(message.message_id, message.actor_name, key,
                                 **{EXISTING_JOB_ID: existing_id, DECISION: decision}))
    if (on := sink) is not None:
        on.inc("duplicates_total", message.queue_name, message.actor_name, decision)


def parked(gate: str, message: Any, group: str) -> None:
    """A job parked on ``group`` of a ``gate`` ("lock" or "slot")."""
    actor = getattr(message, "actor_name", None)
    if logger.isEnabledFor(logging.DEBUG):
        logger.debug("Job %s parked on %s.", message.message_id, group, extra=fields(message.message_id, actor))
    if (on := sink) is not None:
        on.inc("waits_total", getattr(message, "queue_name", None), actor, gate)


def taken_up(gate: str, message: Any, marker: Mapping[str, Any], wake: Mapping[str, Any]) -> None:
    """A woken job took up the gate handed to it: its wait and the hand-over end."""
    if (on := sink) is not None:
        on.taken_up(getattr(message, "queue_name", None), getattr(message, "actor_name", None), gate,
                    marker.get(PARKED_AT), wake.get(HANDED_AT))


def parked_counts(counts: Mapping[tuple[str, str], int]) -> None:  # by (actor, gate), from a re-drive pass
    if (on := sink) is not None:
        on.parked_counts(counts)


def heartbeat(job: Any) -> None:
    if (on := sink) is not None:
        on.inc("heartbeats_total", job.queue_name, job.actor_name)


def lock_lost(job: Any, error: E) -> E:
    """A running job learned that its lock or lease is gone: a WARNING, counted; ``raise lock_lost(job, error)``."""
    job_id, actor = (job.message_id, job.actor_name) if job is not None else ("?", None)
    logger.warning("Job %s (%s) lost its lease: %s", job_id, actor, getattr(error, "detail", error),
                   extra=fields(job_id, actor, getattr(job, "unique_key", None)))
    if (on := sink) is not None:
        on.inc("lock_lost_total", getattr(job, "queue_name", None), actor)
    return error


def fenced_out(job: Any, write: str) -> None:
    """A write ("outcome", "checkpoint" or "lease") refused by the attempt's fencing token: a WARNING, counted."""
    logger.warning("Job %s (%s) was taken over by a newer attempt; its %s write was refused by the fencing "
                   "token %s.", job.message_id, job.actor_name, write, job.fencing_token,
                   extra=fields(job.message_id, job.actor_name, job.unique_key))
    if (on := sink) is not None:
        on.inc("fenced_writes_refused_total", job.queue_name, job.actor_name, write)


def job_lost(row: Any, where: str, then: str) -> None:
    """The re-drive confirmed a job lost: a WARNING; ``then`` says what follows (a failed job has its own line)."""
    logger.warning("Job %s (%s) lost while %s: %s.", row.message_id, row.actor_name, where, then,
                   extra=fields(row.message_id, row.actor_name, row.unique_key))


def job_failed(row: Any, reason: str) -> None:
    logger.warning("Job %s (%s) marked failed: %s.", row.message_id, row.actor_name, reason,
                   extra=fields(row.message_id, row.actor_name, row.unique_key))


def redrive_pass(counts: Any) -> None:  # counts: a RedriveCounts
    if (on := sink) is not None and counts.ran:
        on.redrive_pass(counts.as_dict())


def guarded(fn: F) -> F:
    """A metric update never breaks the suite: its error is logged (with its trace once), the event uncounted."""

    @functools.wraps(fn)
    def update(self: "SuiteMetrics", *args: Any) -> None:
        try:
            fn(self, *args)
        except Exception:
            self.failures += 1
            logger.warning("Could not update a dramatiq_unique metric (%d so far); it goes uncounted.",
                           self.failures, exc_info=self.failures == 1)

    return update  # type: ignore[return-value]


def _label(value: Any) -> str:
    return "" if value is None else str(value)


_JOB = ("queue_name", "actor_name")
#: The metrics by name (after PREFIX): (kind, help, labels, further arguments).
METRICS: dict[str, tuple[str, str, tuple[str, ...], dict[str, Any]]] = {
    "duplicates_total": ("Counter", "Unique sends that met a job holding their key, by decision (skip, raise, "
                         "replace).", (*_JOB, "decision"), {}),
    "waits_total": ("Counter", "Jobs parked to wait for an execution lock or a concurrency slot.",
                    (*_JOB, "gate"), {}),
    "wait_seconds": ("Histogram", "How long a parked job waited, from parking to taking up its lock or slot.",
                     (*_JOB, "gate"), {"buckets": WAIT_BUCKETS}),
    "handover_seconds": ("Histogram", "From a lock or slot handed on by its holder to the woken job taking it up.",
                         (*_JOB, "gate"), {"buckets": HANDOVER_BUCKETS}),
    # Set by each re-drive pass from the job table: the cluster's count, whichever process counted last.
    "parked_jobs": ("Gauge", "Jobs parked now, waiting for an execution lock or a slot (counted by the last "
                    "re-drive pass).", ("actor_name", "gate"), {"multiprocess_mode": "mostrecent"}),
    "fenced_writes_refused_total": ("Counter", "Writes of an attempt refused by its fencing token (a newer attempt "
                                    "owns the job), by write (outcome, checkpoint, lease).", (*_JOB, "write"), {}),
    "heartbeats_total": ("Counter", "heartbeat() calls that renewed a job's leases.", _JOB, {}),
    "lock_lost_total": ("Counter", "Running jobs that learned their lock or lease was gone (LockLost).", _JOB, {}),
    "redrive_jobs_total": ("Counter", "Jobs a re-drive pass handled, by outcome (sent, woken, missing, lost, "
                           "redriven, failed, requeued, pruned, errors, ...).", ("outcome",), {}),
    "redrive_passes_total": ("Counter", "Re-drive passes run by this process.", (), {}),
}


class SuiteMetrics:
    """The metrics (:data:`METRICS`), one update per hook of :mod:`dramatiq_unique.observe.events`."""

    def __init__(self, registry: Any) -> None:
        import prometheus_client as prom

        self.registry = registry
        self.failures = 0
        self.metrics = {name: getattr(prom, kind)(PREFIX + name, doc, labels, registry=registry, **more)
                        for name, (kind, doc, labels, more) in METRICS.items()}
        self._parked_seen: set[tuple[str, str]] = set()

    @guarded
    def inc(self, metric: str, *labels: Any) -> None:
        """Counts one event on ``metric``, labelled by ``labels`` (None: the empty label)."""
        self.metrics[metric].labels(*map(_label, labels)).inc()

    @guarded
    def taken_up(self, queue: Any, actor: Any, gate: str, parked_at: Any, handed_at: Any) -> None:
        now = time.time() * 1000
        labels = (_label(queue), _label(actor), gate)
        for metric, since in (("wait_seconds", parked_at), ("handover_seconds", handed_at)):
            if isinstance(since, (int, float)):
                self.metrics[metric].labels(*labels).observe(max(0.0, now - since) / 1000)

    @guarded
    def parked_counts(self, counts: Mapping[tuple[str, str], int]) -> None:
        # Every group seen before is set too: an emptied one reads 0, not its last count.
        for (actor, gate), count in {**dict.fromkeys(self._parked_seen, 0), **counts}.items():
            self.metrics["parked_jobs"].labels(_label(actor), gate).set(count)
        self._parked_seen |= set(counts)

    @guarded
    def redrive_pass(self, counts: Mapping[str, Any]) -> None:
        self.metrics["redrive_passes_total"].inc()
        for outcome, count in counts.items():
            if outcome != "ran" and isinstance(count, int) and count:  # a count added later is counted too
                self.metrics["redrive_jobs_total"].labels(outcome).inc(count)
