"""Bulk actions (durable/bulk_actions.py): retry the dead set, cancel waiting jobs, each one UPDATE
per job table and store, with retry_job's and cancel_job's semantics; on SQLite and PostgreSQL with
a real Redis broker and workers, and on 100,000 rows of PostgreSQL."""

from __future__ import annotations

import threading
import uuid
from datetime import timedelta
from typing import Any, Callable

import dramatiq
import pytest

import dramatiq_unique
from dramatiq_unique import JobModel
from dramatiq_unique.context import MARKER
from dramatiq_unique.durable import bulk_actions
from dramatiq_unique.durable.bulk_actions import Selection
from dramatiq_unique.durable.messages import RETRY_BASE
from dramatiq_unique.storage.models import utcnow
from tests.durable import passes, running_worker
from tests.helpers import job_of, queue_lock_of, wait_until

FAST_RETRY = dict(min_backoff=10, max_backoff=10)


def status_of(message: Any, status: str, timeout: float = 10) -> JobModel:
    return wait_until(lambda: (job := job_of(message)) is not None and job.status == status and job,
                      timeout=timeout, what=f"job {message.message_id} {status}")


def foreign_row(app: str, actor: str, status: str = "failed") -> int:
    """A row written by another app (or, with this app's name, of an actor nobody here declares)."""
    return JobModel.insert(app=app, message_id=str(uuid.uuid4()), actor_name=actor, queue_name="default",
                           status=status, attempts=1, finished_at=utcnow()).execute()


def test_retry_all_takes_keys_back_reports_the_blocked_and_the_jobs_run_again(suite, broker, key_prefix):
    """Given dead jobs of a plain actor, of an until_executed key (two of key 7, one of key 8 whose key a
    new job holds), of a while_executing key, one of an actor not declared here and one of another app:
    Then a bulk retry takes every job whose key is free back in one UPDATE, reports the two it cannot
    retry (key 8's holder; key 7's older job, whose key the newer takes), leaves the others alone, and
    the re-drive sends the retried ones, which run with Retries' count restarted."""
    state = {"fail": True}

    @dramatiq.actor(track=True, max_retries=1, **FAST_RETRY)
    def charge(n):
        if state["fail"]:
            raise RuntimeError(f"charge {n}")

    @dramatiq.actor(unique_args=["user"], unique_lock="until_executed", max_retries=0)
    def keyed(user, part=0):
        if state["fail"]:
            raise ValueError(f"keyed {user}")

    @dramatiq.actor(unique_args=["user"], unique_lock="while_executing", max_retries=0)
    def while_keyed(user):
        if state["fail"]:
            raise ValueError(f"while {user}")

    with running_worker(broker, threads=2):
        dead = [status_of(m, "failed") for m in (charge.send(1), charge.send(2), keyed.send(7, 0))]
        dead += [status_of(m, "failed") for m in (keyed.send(7, 1), keyed.send(8), while_keyed.send(9))]
    old7, new7, dead8 = dead[2], dead[3], dead[4]
    holder8 = status_of(keyed.send(8, 1), "queued")  # no worker: it waits, holding key 8
    ghost = foreign_row(suite.app, "ghost")
    other = foreign_row("another_app", "charge")

    preview = bulk_actions.preview(suite, broker, "retry", Selection())
    assert (preview.done, preview.undeclared) == (6, 1)

    outcome = bulk_actions.retry_all(suite, broker, Selection())
    assert (outcome.done, outcome.blocked, outcome.undeclared, outcome.down) == (4, 2, 1, [])
    assert sorted(outcome.blocked_by) == sorted([(old7.id, new7.id), (dead8.id, holder8.id)])  # 7: the newer took it
    assert JobModel.get_by_id(ghost).status == "failed" and JobModel.get_by_id(other).status == "failed"
    for job in (old7, dead8):
        assert JobModel.get_by_id(job.id).status == "failed"
    retried = [JobModel.get_by_id(job.id) for job in (dead[0], dead[1], new7, dead[5])]
    for before, after in zip((dead[0], dead[1], new7, dead[5]), retried, strict=True):
        assert (after.status, after.revision, after.fencing_token) == (
            "pending", before.revision + 1, before.fencing_token + 1)
        assert after.finished_at is None and after.options[MARKER][RETRY_BASE] == before.attempts
        assert "retries" not in after.options
    assert retried[2].unique_hold == new7.unique_key  # key 7 taken back
    assert retried[3].unique_hold is None  # while_executing: no key while waiting
    assert keyed.send(7, 2).message_id == new7.message_id  # a duplicate send finds the retried job

    state["fail"] = False
    with running_worker(broker, threads=2):
        sent = sum(c.sent for c in passes(1))
        assert sent >= 4
        for job in retried:
            wait_until(lambda job=job: JobModel.get_by_id(job.id).status == "succeeded", timeout=10,
                       what=f"job {job.id} run again")
    assert JobModel.get_by_id(dead[0].id).attempts == 3  # 2 failed, then the retried attempt
    assert dramatiq_unique.dead_jobs(actor_name="charge") == []


def test_retry_all_of_a_selection(suite, broker):
    """An actor, an error text and a time select the dead jobs retried; the rest stay dead."""
    @dramatiq.actor(track=True, max_retries=0)
    def a(text):
        raise RuntimeError(text)

    @dramatiq.actor(track=True, max_retries=0)
    def b(text):
        raise RuntimeError(text)

    with running_worker(broker, threads=1):
        jobs = [status_of(m, "failed") for m in (a.send("timeout 100%"), a.send("refused"), b.send("timeout"))]
    assert bulk_actions.retry_all(suite, broker, Selection(actor="a", error="TIMEOUT 100%")).done == 1
    assert [str(JobModel.get_by_id(j.id).status) for j in jobs] == ["pending", "failed", "failed"]
    assert bulk_actions.retry_all(suite, broker, Selection(since=utcnow() + timedelta(minutes=1))).done == 0
    assert bulk_actions.retry_all(suite, broker, Selection(error="t%t")).done == 0  # "%" is a character, no wildcard
    assert bulk_actions.retry_all(suite, broker, Selection(actor="b")).done == 1


def test_cancel_all_cancels_waiting_jobs_frees_their_keys_and_leaves_running_ones(suite, broker, redis_client):
    """Given a job running with its slot, two parked behind it, a unique job queued (its queue lock in
    Redis) and a job due later: cancelling all waiting jobs cancels the four in one UPDATE, releases the
    queue lock, leaves the running one; the parked ones never run, the slot group goes on, and a new send
    of the freed key is a new job."""
    release = threading.Event()

    @dramatiq.actor(concurrency_limit=1, concurrency_ttl=30_000, queue_name="slow")
    def slow(n):
        if n == 0:
            release.wait(30)

    @dramatiq.actor(unique_args=["user"], unique_lock="until_executed", queue_name="idle")
    def keyed(user):
        pass

    @dramatiq.actor(track=True, queue_name="idle")
    def later(n):
        pass

    worker = dramatiq.Worker(broker, worker_timeout=50, worker_threads=4, queues={"slow"})
    worker.start()
    try:
        running = status_of(slow.send(0), "running")
        parked = [status_of(slow.send(n), "pending") for n in (1, 2)]
        wait_until(lambda: all(JobModel.get_by_id(j.id).parked_on for j in parked), timeout=10, what="parked")
        held = keyed.send(7)
        assert queue_lock_of(suite, redis_client, held.message_id) is not None
        due_later = later.send_with_options(args=(1,), delay=60_000)
        waiting = [*parked, job_of(held), job_of(due_later)]

        assert bulk_actions.preview(suite, broker, "cancel", Selection(statuses=("queued",))).done == 2  # keyed, later
        outcome = bulk_actions.cancel_all(suite, broker, Selection())
        assert (outcome.done, outcome.undeclared) == (4, 0)
        for job in waiting:
            row = JobModel.get_by_id(job.id)
            assert (row.status, row.unique_hold, row.parked_on) == ("cancelled", None, None)
            assert row.revision == job.revision + 1 and row.finished_at is not None
        assert JobModel.get_by_id(running.id).status == "running"
        assert queue_lock_of(suite, redis_client, held.message_id) is None
        assert keyed.send(7).message_id != held.message_id  # the key is free: a new job

        release.set()
        status_of(running, "succeeded")
        after = slow.send(3)
        status_of(after, "succeeded")  # the group goes on: the cancelled ones were never woken
        assert all(JobModel.get_by_id(j.id).status == "cancelled" for j in parked)
    finally:
        release.set()
        worker.stop(timeout=10_000)
    with pytest.raises(ValueError, match="only waiting jobs"):
        bulk_actions.cancel_all(suite, broker, Selection(statuses=("running",)))


# -- on 100,000 rows ------------------------------------------------------------------------------

ROWS = 100_000


def _fill(db: Any, app: str, status: str) -> None:
    """ROWS rows of actor ``mass`` in one INSERT ... SELECT: the first half with unique keys of their own."""
    db.execute_sql(
        f"""INSERT INTO "dramatiq_unique_jobs" ("app", "message_id", "actor_name", "queue_name", "args", "kwargs",
               "options", "unique_key", "status", "attempts", "revision", "created_at", "finished_at",
               "fencing_token")
            SELECT %s, 'mass-' || g, 'mass', 'default', '[' || g || ']', '{{}}', '{{"{MARKER}": {{"id": 0}}}}',
                   CASE WHEN g <= {ROWS // 2} THEN 'mass:' || g END, %s, 1, 0,
                   now() AT TIME ZONE 'UTC', now() AT TIME ZONE 'UTC', 0
            FROM generate_series(1, {ROWS}) AS g""",
        (app, status),
    )


def _counting(db: Any, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every statement ``db`` runs from now on, by its first word."""
    seen: list[str] = []
    run: Callable[..., Any] = db.execute_sql

    def execute_sql(sql: str, params: Any = None, *args: Any, **kwargs: Any) -> Any:
        seen.append(sql.split(None, 1)[0].upper())
        return run(sql, params, *args, **kwargs)

    monkeypatch.setattr(db, "execute_sql", execute_sql)
    return seen


@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
def test_each_bulk_action_is_one_statement_on_100k_rows(suite, broker, monkeypatch):
    """Given 100,000 dead jobs (half with unique keys), a bulk retry is one UPDATE (and two counts),
    whatever the number of rows; then a bulk cancel of the 100,000 now waiting is one UPDATE too."""
    @dramatiq.actor(unique_args=["n"], unique_lock="until_executed")
    def mass(n):
        pass

    _fill(suite.db, suite.app, "failed")
    seen = _counting(suite.db, monkeypatch)
    assert bulk_actions.preview(suite, broker, "retry", Selection()).done == ROWS
    assert seen == ["SELECT"]

    seen.clear()
    outcome = bulk_actions.retry_all(suite, broker, Selection(actor="mass"))
    assert (outcome.done, outcome.blocked) == (ROWS, 0)
    assert seen.count("UPDATE") == 1 and len(seen) <= 4, seen  # the UPDATE, then the blocked and left counts
    assert list(JobModel.select(JobModel.status, JobModel.revision, JobModel.fencing_token).distinct().tuples()) == [
        ("pending", 1, 1)]
    assert JobModel.select().where(JobModel.unique_hold.is_null(False)).count() == ROWS // 2
    sample = JobModel.get(JobModel.message_id == "mass-7")
    assert sample.options[MARKER] == {"id": 0, RETRY_BASE: 1} and sample.unique_hold == "mass:7"

    seen.clear()
    outcome = bulk_actions.cancel_all(suite, broker, Selection(actor="mass"))
    assert outcome.done == ROWS
    assert seen.count("UPDATE") == 1 and len(seen) <= 2, seen
    assert JobModel.select().where(JobModel.status == "cancelled").count() == ROWS
    assert JobModel.select().where(JobModel.unique_hold.is_null(False)).count() == 0
