"""Successes written together (dramatiq_unique.durable.successes), on real Redis and PostgreSQL (the only
store they are written together in)."""

from __future__ import annotations

import threading
import time
from typing import Any

import dramatiq
import peewee as pw
import pytest

import dramatiq_unique
from dramatiq_unique.durable.successes import Successes
from dramatiq_unique.storage import jobs, queries
from dramatiq_unique.storage.models import JobModel, utcnow
from tests.helpers import wait_until


@pytest.fixture
def database_url(postgres_either_driver: Any) -> Any:
    """PostgreSQL, the store whose successes are written together, on either driver."""
    return postgres_either_driver


class Writes:
    """Counts the outcome statements: one of its own per success, or one for several; the first ``slow``
    written alone take ``delay`` seconds each, so that other threads' successes meet them."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, slow: int = 0, delay: float = 0.3) -> None:
        self.alone: list[int] = []
        self.together: list[list[int]] = []
        finish, finish_succeeded = jobs.finish, jobs.finish_succeeded

        def counted_finish(model: Any, job: Any, **kwargs: Any) -> Any:
            self.alone.append(job.id)
            if len(self.alone) <= slow:
                time.sleep(delay)
            return finish(model, job, **kwargs)

        def counted_finish_succeeded(model: Any, done: Any) -> Any:
            self.together.append([job.id for job, *_ in done])
            return finish_succeeded(model, done)

        monkeypatch.setattr(jobs, "finish", counted_finish)
        monkeypatch.setattr(jobs, "finish_succeeded", counted_finish_succeeded)


def rows(messages: list[Any]) -> list[Any]:
    return [dramatiq_unique.get_job(m.message_id) for m in messages]


def started_rows(actor: Any, n: int) -> list[Any]:
    """``n`` jobs of ``actor`` sent and started, as a worker thread holds them."""
    messages = [actor.send(i) for i in range(n)]
    model = JobModel
    started = []
    for message in messages:
        marker = message.options["dramatiq_unique"]
        job = jobs.start(model, marker["id"], revision=0, lease_ms=60_000, worker="test:1", release_hold=False)
        assert job is not None
        started.append(job)
    return started


def finish_at_once(successes: Successes, model: Any, started: list[Any], **extra: Any) -> list[bool]:
    """Each job's success written by a thread of its own, all asked for at once."""
    verdicts: list[Any] = [None] * len(started)
    go = threading.Barrier(len(started))

    def finish(i: int) -> None:
        go.wait(5)
        verdicts[i] = successes.finish(model, started[i], release_hold=extra.get("release", False),
                                       status="succeeded", finished_at=utcnow(), result={"n": i},
                                       last_error=None, lease_until=None)

    threads = [threading.Thread(target=finish, args=(i,)) for i in range(len(started))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    return verdicts


def test_successes_that_meet_a_write_under_way_share_one_statement(charge, monkeypatch):
    writes = Writes(monkeypatch, slow=1)
    model = JobModel
    started = started_rows(charge, 6)
    assert finish_at_once(Successes(), model, started) == [True] * 6
    # The first writes alone (slowly); the five that met it share the next statement.
    assert len(writes.alone) == 1 and [sorted(ids) for ids in writes.together] == [
        sorted(j.id for j in started if j.id not in writes.alone)]
    for i, row in enumerate(model.select().where(model.id.in_([j.id for j in started])).order_by(model.id)):
        assert (row.status, row.result, row.last_error, row.lease_until) == ("succeeded", {"n": i}, None, None)
        assert row.finished_at >= row.started_at
        [entry] = row.history
        assert (entry["status"], entry["attempt"], entry["worker"], entry["error"]) == ("succeeded", 1, "test:1", None)


def test_a_success_whose_row_a_newer_attempt_owns_is_refused_in_a_shared_statement_too(charge, monkeypatch):
    writes = Writes(monkeypatch, slow=1)
    model = JobModel
    started = started_rows(charge, 4)
    stale = started[2]
    model.update(fencing_token=model.fencing_token + 1).where(model.id == stale.id).execute()  # a newer attempt
    verdicts = finish_at_once(Successes(), model, started)
    assert verdicts == [job.id != stale.id for job in started]
    assert writes.together  # the stale one was in a shared statement, or the slow one alone
    assert model.get_by_id(stale.id).status == "running"


def test_a_success_that_frees_its_key_frees_it_in_the_shared_statement(suite, broker, monkeypatch):
    Writes(monkeypatch, slow=1)

    @dramatiq.actor(unique_args=["i"], unique_lock="until_executed")
    def job(i: int) -> None:
        pass

    model = JobModel
    started = started_rows(job, 4)
    assert all(model.get_by_id(j.id).unique_hold is not None for j in started)
    assert finish_at_once(Successes(), model, started, release=True) == [True] * 4
    assert all(model.get_by_id(j.id).unique_hold is None for j in started)


def test_a_shared_statement_that_fails_leaves_each_success_to_its_own_thread(charge, monkeypatch):
    writes = Writes(monkeypatch, slow=1)

    def broken(model: Any, done: Any) -> Any:
        writes.together.append([job.id for job, *_ in done])
        raise pw.OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(jobs, "finish_succeeded", broken)
    model = JobModel
    started = started_rows(charge, 4)
    assert finish_at_once(Successes(), model, started) == [True] * 4
    assert len(writes.together) == 1 and len(writes.alone) == 4  # the first, then the three the batch failed
    assert all(len(model.get_by_id(j.id).history) == 1 for j in started)


def test_a_worker_writes_its_threads_successes_together(suite, broker, make_worker, monkeypatch):
    """End to end: eight threads of no-op jobs; each job succeeds once, with one history entry, and fewer
    outcome statements than jobs are written."""
    writes = Writes(monkeypatch, slow=1)
    ran: list[int] = []

    @dramatiq.actor(track=True)
    def job(i: int) -> int:
        ran.append(i)
        return i * 2

    messages = [job.send(i) for i in range(120)]
    make_worker(8)
    wait_until(lambda: all(r.status == "succeeded" for r in rows(messages)), what="every job succeeded")
    assert sorted(ran) == list(range(120))
    done = rows(messages)
    assert [r.result for r in done] == [i * 2 for i in range(120)]
    assert all(len(r.history) == 1 and r.attempts == 1 for r in done)
    assert len(writes.alone) + sum(len(ids) for ids in writes.together) == 120
    assert writes.together and max(len(ids) for ids in writes.together) > 1


@pytest.mark.parametrize("name", ["finish_succeeded", "start_fetched"])
def test_the_kept_plan_of_a_statement_over_rows_joins_by_the_primary_key(suite, name):
    """On a table of 20,000 rows, analyzed (as autovacuum leaves it), the generic plan a worker's connection
    keeps for the statement reads each row by its id: no scan of the table, whose cost would grow with it."""
    db, table = JobModel._meta.database, JobModel._meta.table_name
    db.execute_sql(
        f'INSERT INTO "{table}" ("app", "message_id", "actor_name", "queue_name", "args", "kwargs", "options", '
        '"status", "attempts", "revision", "created_at", "fencing_token") '
        "SELECT '', 'plan-' || n, 'job', 'default', '[]', '{}', '{}', 'succeeded', 1, 0, now(), 1 "
        "FROM generate_series(1, 20000) AS n")
    db.execute_sql(f'ANALYZE "{table}"')
    query = queries.statement(JobModel, name)
    db.execute_sql(f"PREPARE plan_check AS {query.prepare_sql}")
    db.execute_sql("SET plan_cache_mode = force_generic_plan")
    try:
        nulls = ", ".join("NULL" for _ in query.params)
        plan = "\n".join(row[0] for row in db.execute_sql(f"EXPLAIN EXECUTE plan_check({nulls})").fetchall())
    finally:
        db.execute_sql("RESET plan_cache_mode")
        db.execute_sql("DEALLOCATE plan_check")
    assert "Seq Scan" not in plan and "Nested Loop" in plan and f"Index Scan using {table}_pkey" in plan, plan
