"""The overview's timings (ops.stats) on real Redis and SQLite/PostgreSQL: the waits the suite
causes (jobs parked for a slot) are counted, from creation, and the time parked apart."""

from __future__ import annotations

import threading
import time

import dramatiq

from dramatiq_unique import JobModel, ops
from dramatiq_unique.ops.stats import percentile
from tests.helpers import wait_until

#: Seconds the slot's holder keeps it after the others parked: a floor of their waits.
HELD = 1.0


def _statuses(actor: str) -> list[str]:
    return [str(row.status) for row in JobModel.select().where(JobModel.actor_name == actor).order_by(JobModel.id)]


def test_a_parked_job_s_wait_counts_from_its_creation_and_its_time_parked_is_shown(suite, make_worker):
    """Given one slot, a job holding it and two parked behind it for at least HELD seconds, When they
    have all run, Then the waits count from creation (the wake-up's enqueued_at does not hide them) and
    the time parked is shown, for the two jobs that parked."""
    release = threading.Event()
    make_worker(4)

    @dramatiq.actor(concurrency_limit=1, concurrency_ttl=30_000)
    def one_at_a_time(n: int) -> None:
        if n == 0:
            release.wait(30)

    one_at_a_time.send(0)
    wait_until(lambda: _statuses("one_at_a_time") == ["running"], timeout=20, what="the holder running")
    one_at_a_time.send(1)
    one_at_a_time.send(2)
    wait_until(lambda: _statuses("one_at_a_time") == ["running", "pending", "pending"], timeout=20,
               what="one running, two parked")
    time.sleep(HELD)
    release.set()
    wait_until(lambda: _statuses("one_at_a_time") == ["succeeded"] * 3, timeout=20, what="all three done")

    stats = ops.stats(suite)
    # Two of three waited at least HELD: the median is one of them.
    assert stats.waiting_ms["p50"] is not None and stats.waiting_ms["p50"] >= HELD * 1000, stats.waiting_ms
    assert stats.timed == 3 and stats.parked == 2, stats
    assert stats.parked_ms["p50"] is not None and stats.parked_ms["p50"] >= HELD * 1000, stats.parked_ms
    assert stats.as_dict()["parked_ms"] == stats.parked_ms


def test_an_earlier_attempt_s_parking_is_not_counted_for_the_last_one(suite, make_worker):
    """Given a job parked behind a holder whose first attempt then fails and whose retry runs at once,
    When the stats are read, Then the retry is not counted as parked (its wait was not), and its
    wait counts from the retry's due time, not from the job's creation."""
    release = threading.Event()
    failed_once: set[int] = set()
    make_worker(4)

    @dramatiq.actor(concurrency_limit=1, concurrency_ttl=30_000, max_retries=1, min_backoff=10, max_backoff=10)
    def flaky(n: int) -> None:
        if n == 0:
            release.wait(30)
        elif n not in failed_once:
            failed_once.add(n)
            raise RuntimeError("first attempt fails")

    flaky.send(0)
    wait_until(lambda: _statuses("flaky") == ["running"], timeout=20, what="the holder running")
    flaky.send(1)
    wait_until(lambda: _statuses("flaky") == ["running", "pending"], timeout=20, what="the second parked")
    time.sleep(HELD)
    release.set()
    wait_until(lambda: _statuses("flaky") == ["succeeded"] * 2, timeout=20, what="both done")

    rows = list(JobModel.select().where(JobModel.actor_name == "flaky").order_by(JobModel.id))
    retried = rows[1]
    assert retried.attempts == 2 and retried.parked_attempt == 0  # parked before its first attempt only
    assert (retried.started_at - retried.created_at).total_seconds() >= HELD
    stats = ops.stats(suite)
    assert stats.timed == 2 and stats.parked == 0 and stats.parked_ms == {"p50": None, "p95": None}, stats
    # Each wait from when the job could run: the retry's from its due time, not from its creation.
    waits = [(row.started_at - max(row.created_at, row.process_after)).total_seconds() * 1000 for row in rows]
    assert stats.waiting_ms["p95"] is not None
    assert abs(stats.waiting_ms["p95"] - percentile(waits, 0.95)) < 1, (stats.waiting_ms, waits)
