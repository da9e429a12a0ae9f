"""The suite's Prometheus metrics, one method per hook of :mod:`dramatiq_unique.observe.events`.

Imported only when metrics are turned on: ``prometheus_client`` must see its multiprocess directory
first.  Labels are bounded (actor, queue, gate, decision, write, outcome): never a key nor a job id.
"""

from __future__ import annotations

import functools
import logging
import time
from typing import Any, Callable, Mapping, Optional, TypeVar

import prometheus_client as prom

logger = logging.getLogger(__name__)

#: Every metric's name starts with this.
PREFIX = "dramatiq_unique_"
#: Buckets (seconds) of how long a parked job waited for its lock or slot.
WAIT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600, float("inf"))
#: Buckets (seconds) of a hand-over: from a gate handed on to the woken job taking it up.
HANDOVER_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 60, float("inf"))
#: The outcomes of a re-drive pass that are counted (RedriveCounts' fields; one added later is counted too).
SKIPPED_COUNTS = frozenset({"ran"})

F = TypeVar("F", bound=Callable[..., None])


def guarded(fn: F) -> F:
    """A metric update never breaks the suite: its error is logged (with its trace once), the event
    goes uncounted."""

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


class SuiteMetrics:
    """The metrics, and the updates the hooks of :mod:`dramatiq_unique.observe.events` make."""

    def __init__(self, registry: Optional[prom.CollectorRegistry]) -> None:
        self.registry = registry
        self.failures = 0
        job = ["queue_name", "actor_name"]
        kw: dict[str, Any] = {"registry": registry}
        self.duplicates = prom.Counter(
            PREFIX + "duplicates_total", "Unique sends that met a job holding their key, by decision "
            "(skip, raise, replace).", [*job, "decision"], **kw)
        self.waits = prom.Counter(
            PREFIX + "waits_total", "Jobs parked to wait for an execution lock or a concurrency slot.",
            [*job, "gate"], **kw)
        self.wait_seconds = prom.Histogram(
            PREFIX + "wait_seconds", "How long a parked job waited, from parking to taking up its lock or slot.",
            [*job, "gate"], buckets=WAIT_BUCKETS, **kw)
        self.handover_seconds = prom.Histogram(
            PREFIX + "handover_seconds", "From a lock or slot handed on by its holder to the woken job taking "
            "it up.", [*job, "gate"], buckets=HANDOVER_BUCKETS, **kw)
        # Set by each re-drive pass from the job table: the cluster's count, whichever process counted last.
        self.parked_jobs = prom.Gauge(
            PREFIX + "parked_jobs", "Jobs parked now, waiting for an execution lock or a slot (counted by the "
            "last re-drive pass).", ["actor_name", "gate"], multiprocess_mode="mostrecent", **kw)
        self.fenced = prom.Counter(
            PREFIX + "fenced_writes_refused_total", "Writes of an attempt refused by its fencing token (a newer "
            "attempt owns the job), by write (outcome, checkpoint, lease).", [*job, "write"], **kw)
        self.heartbeats = prom.Counter(
            PREFIX + "heartbeats_total", "heartbeat() calls that renewed a job's leases.", job, **kw)
        self.locks_lost = prom.Counter(
            PREFIX + "lock_lost_total", "Running jobs that learned their lock or lease was gone (LockLost).",
            job, **kw)
        self.redrive_jobs = prom.Counter(
            PREFIX + "redrive_jobs_total", "Jobs a re-drive pass handled, by outcome (sent, woken, missing, "
            "lost, redriven, failed, requeued, pruned, errors, ...).", ["outcome"], **kw)
        self.redrive_passes = prom.Counter(
            PREFIX + "redrive_passes_total", "Re-drive passes run by this process.", **kw)
        self._parked_seen: set[tuple[str, str]] = set()
        self.collectors = [self.duplicates, self.waits, self.wait_seconds, self.handover_seconds, self.parked_jobs,
                           self.fenced, self.heartbeats, self.locks_lost, self.redrive_jobs, self.redrive_passes]

    @guarded
    def inc(self, counter: prom.Counter, *labels: Any) -> None:
        """Counts one event on ``counter``, labelled by ``labels`` (None: the empty label)."""
        counter.labels(*map(_label, labels)).inc()

    @guarded
    def taken_up(self, queue: Any, actor: Any, gate: str, parked_at: Any, handed_at: Any) -> None:
        now = time.time() * 1000
        labels = (_label(queue), _label(actor), gate)
        if isinstance(parked_at, (int, float)):
            self.wait_seconds.labels(*labels).observe(max(0.0, now - parked_at) / 1000)
        if isinstance(handed_at, (int, float)):
            self.handover_seconds.labels(*labels).observe(max(0.0, now - handed_at) / 1000)

    @guarded
    def parked_counts(self, counts: Mapping[tuple[str, str], int]) -> None:
        for actor, gate in self._parked_seen - set(counts):  # emptied groups read 0, not their last count
            self.parked_jobs.labels(actor, gate).set(0)
        for (actor, gate), count in counts.items():
            self.parked_jobs.labels(_label(actor), gate).set(count)
        self._parked_seen |= set(counts)

    @guarded
    def redrive_pass(self, counts: Mapping[str, Any]) -> None:
        self.redrive_passes.inc()
        for outcome, count in counts.items():
            if outcome not in SKIPPED_COUNTS and isinstance(count, int) and count:
                self.redrive_jobs.labels(outcome).inc(count)
