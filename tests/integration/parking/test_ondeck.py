"""Rows on deck (dramatiq_unique.parking.lot): the next jobs of a busy slot group, reserved ahead by this process."""

from __future__ import annotations

import logging
import time
import uuid

import dramatiq

import dramatiq_unique
from dramatiq_unique import JobModel, concurrency_status
from dramatiq_unique.parking import lot
from dramatiq_unique.slots.gate import gate_of
from dramatiq_unique.storage import jobs
from dramatiq_unique.storage.models import JobStatus, after_ms, utcnow
from tests.helpers import wait_until
from tests.integration.parking.helpers import reserved
from tests.integration.slots.helpers import Recorder, assert_all_succeeded_once, queue_behind_a_holder, rows


def test_reserved_jobs_stay_parked_and_start_in_order_once_each(suite, broker, make_worker, caplog):
    """Given a limit of 1 and jobs parked behind a running one in this process, When they wait,
    Then the next two are reserved for this process's deck yet still count as parked; When each
    holder ends, Then the first reserved job starts, once, with its start recorded when it began."""
    caplog.set_level(logging.DEBUG, logger="dramatiq_unique")
    rec = Recorder()

    @dramatiq.actor(concurrency_limit=1)
    def step(i: int) -> None:
        rec.run("g", i, 1_000 if i == 0 else 30)  # long enough for all four to park behind it

    make_worker(4)
    queue_behind_a_holder(step, rec, 5)
    wait_until(lambda: len(reserved("step")) == lot.DEPTH, timeout=10, what="rows on deck")
    # The last two may still be on their way to parking when the deck is full.
    wait_until(lambda: concurrency_status("step").parked == 4, timeout=5, what="4 parked jobs")
    assert rec.started() == 1
    assert {r.status for r in reserved("step")} == {"pending"}
    wait_until(lambda: rec.ended() == 5, timeout=10, what="5 jobs to end")
    assert rec.order("g") == [0, 1, 2, 3, 4]
    assert rec.peak["g"] == 1
    assert_all_succeeded_once("step", 5)
    found = rows("step")
    assert all(r.worker.endswith(":woken") for r in found[1:]), [r.worker for r in found]
    # Reserved while job 0 ran its 300 ms, but recorded as started when it did start:
    assert (found[1].started_at - found[0].started_at).total_seconds() >= 0.25
    assert reserved("step") == []
    # Every hand-over went through the deck, and nothing on the way failed.
    assert sum("on deck" in r.getMessage() for r in caplog.records) == 4
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


def test_a_job_from_the_deck_runs_only_once_its_start_is_in_the_database(suite, broker, make_worker, monkeypatch):
    """Given the start of a job from the deck written slowly, When the job runs, Then its row already says
    running, under the attempt's own fencing token and worker (the start is written before the delivery);
    its outcome is recorded: one attempt, succeeded."""
    written = jobs.start_reserved

    def slow_start(*args, **kwargs):
        time.sleep(0.3)
        return written(*args, **kwargs)

    monkeypatch.setattr(jobs, "start_reserved", slow_start)
    rec, seen = Recorder(), {}

    @dramatiq.actor(concurrency_limit=1)
    def quick(i: int) -> None:
        job, row = dramatiq_unique.current_job(), JobModel.get_by_id(dramatiq_unique.current_job().id)
        seen[i] = (row.status, row.fencing_token == job.fencing_token, row.worker == job.worker)
        rec.run("g", i, 150 if i == 0 else 1)

    make_worker(4)
    queue_behind_a_holder(quick, rec, 2)
    wait_until(lambda: len(reserved("quick")) == 1, timeout=10, what="a row on deck")
    wait_until(lambda: rec.ended() == 2, timeout=10, what="2 jobs to end")
    assert seen[1] == ("running", True, True)
    assert_all_succeeded_once("quick", 2)


def test_stopping_the_worker_gives_reserved_jobs_back(suite, broker, make_worker):
    """Given jobs reserved on deck behind a long one, When the worker stops, Then their reservations are
    cleared (parked, flagged) and another worker runs every job once."""
    rec = Recorder()

    @dramatiq.actor(concurrency_limit=1)
    def slow(i: int) -> None:
        rec.run("g", i, 400 if i == 0 else 10)

    first = make_worker(4)
    queue_behind_a_holder(slow, rec, 4)
    wait_until(lambda: len(reserved("slow")) == lot.DEPTH, timeout=10, what="rows on deck")
    first.stop(timeout=10_000)  # lets the running job finish
    assert reserved("slow") == []
    # Parked again, or (the last hand-over, after the worker let go of its deck) sent through the broker:
    assert {r.status for r in rows("slow")[1:]} <= {"pending", "queued"}
    make_worker(4)
    wait_until(lambda: rec.ended() == 4, timeout=10, what="4 jobs to end")
    assert_all_succeeded_once("slow", 4)


def test_other_wakers_skip_a_reserved_row_until_its_reservation_ends(suite, broker):
    """Given two parked rows, the first reserved by a process, When another waker claims, Then it gets the
    second; When the reservation has run out, Then the first can be claimed again."""

    @dramatiq.actor(concurrency_limit=1)
    def job(i: int) -> None:
        pass

    group = "slot:job:all"
    for i in range(2):
        JobModel.create(message_id=str(uuid.uuid4()), actor_name="job", queue_name="default", args=[i],
                        status=JobStatus.PENDING.value, parked_on=group, created_at=after_ms(i - 10_000),
                        app=suite.app)
    info = gate_of(suite).describe(group)
    first = jobs.reserve(JobModel, group, info.order_by, "elsewhere:1:deck", 200, app=suite.app)
    assert first is not None and first.args == [0]
    claimed = jobs.claim_parked(JobModel, group, "created_at", utcnow(), "ref", app=suite.app)
    assert claimed is not None and claimed.args == [1]
    assert jobs.claim_parked(JobModel, group, "created_at", utcnow(), "ref", app=suite.app) is None
    time.sleep(0.25)
    again = jobs.claim_parked(JobModel, group, "created_at", utcnow(), "ref", app=suite.app)
    assert again is not None and again.args == [0]


def test_a_row_kept_on_deck_too_long_goes_back_to_the_queue(suite, broker, make_worker, monkeypatch):
    """Given a holder running a long job and rows reserved behind it, When they wait longer than the
    deck's bound, Then the watchdog puts them back (parked, unreserved), and they still run in order."""
    monkeypatch.setattr(lot, "MAX_WAIT_MS", 200)
    rec = Recorder()

    @dramatiq.actor(concurrency_limit=1)
    def long(i: int) -> None:
        rec.run("g", i, 1_500 if i == 0 else 10)

    make_worker(4)
    queue_behind_a_holder(long, rec, 3)
    wait_until(lambda: len(reserved("long")) == 2, timeout=10, what="rows on deck")
    wait_until(lambda: reserved("long") == [], timeout=5, what="the watchdog to put them back")
    assert rec.started() == 1
    wait_until(lambda: rec.ended() == 3, timeout=10, what="3 jobs to end")
    assert rec.order("g") == [0, 1, 2]
    assert_all_succeeded_once("long", 3)


def test_the_deck_can_be_turned_off(suite, broker, make_worker):
    """Given ondeck.enabled off, When jobs wait for a slot, Then none is reserved and all run once."""
    dramatiq_unique.parking.lot.of(suite).ondeck.enabled = False
    rec = Recorder()

    @dramatiq.actor(concurrency_limit=1)
    def plain(i: int) -> None:
        rec.run("g", i, 50)

    make_worker(4)
    for i in range(4):
        plain.send(i)
    seen = []
    deadline = time.monotonic() + 10
    while rec.ended() < 4 and time.monotonic() < deadline:
        seen += reserved("plain")
        time.sleep(0.01)
    assert seen == []
    assert_all_succeeded_once("plain", 4)


def test_current_job_of_a_job_from_the_deck_is_its_whole_row(suite, broker, make_worker):
    """Given jobs started from the deck (their reservation read only some columns), When the actor asks
    current_job(), Then it gets the whole row, as this attempt knows it: running, attempt 1, its worker."""
    seen: dict = {}
    rec = Recorder()

    @dramatiq.actor(concurrency_limit=1)
    def look(i: int) -> None:
        job = dramatiq_unique.current_job()
        seen[i] = (str(getattr(job.status, "value", job.status)), job.attempts, job.worker, job.enqueued_at, job.kwargs)
        rec.run("g", i, 250 if i == 0 else 5)

    make_worker(4)
    queue_behind_a_holder(look, rec, 3)
    wait_until(lambda: rec.ended() == 3, timeout=10, what="3 jobs to end")
    for i in (1, 2):
        status, attempts, worker, enqueued_at, kwargs = seen[i]
        assert (status, attempts, kwargs) == ("running", 1, {})
        assert worker.endswith(":woken") and enqueued_at is not None
    assert_all_succeeded_once("look", 3)
