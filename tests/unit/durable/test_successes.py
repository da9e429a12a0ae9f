"""Who writes which success (dramatiq_unique.durable.successes), with the statements replaced (no service
needed): a thread alone writes its own, threads that meet a write under way share the next one, a failed
shared write leaves each to its own thread."""

from __future__ import annotations

import threading
from typing import Any

import peewee as pw
import pytest

from dramatiq_unique.durable.successes import Successes
from dramatiq_unique.storage import jobs
from dramatiq_unique.storage.models import JobModel, utcnow


class Model(JobModel):
    class Meta:
        database = pw.PostgresqlDatabase(None)  # never connected: the statements are replaced


class Statements:
    """Stand-ins for the outcome statements; the first single write waits for ``release``."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, *, shared_fails: bool = False) -> None:
        self.alone: list[int] = []
        self.shared: list[list[int]] = []
        self.entered, self.release = threading.Event(), threading.Event()
        self.refused: set[int] = set()

        def finish(model: Any, job: Any, **fields: Any) -> bool:
            self.alone.append(job.id)
            if len(self.alone) == 1:
                self.entered.set()
                assert self.release.wait(5)
            return job.id not in self.refused

        def finish_succeeded(model: Any, done: Any) -> set[int]:
            self.shared.append([job.id for job, *_ in done])
            if shared_fails:
                raise pw.OperationalError("server closed the connection unexpectedly")
            return {job.id for job, *_ in done} - self.refused

        monkeypatch.setattr(jobs, "finish", finish)
        monkeypatch.setattr(jobs, "finish_succeeded", finish_succeeded)


def job(n: int) -> Model:
    return Model(id=n, fencing_token=1)


def succeed(successes: Successes, n: int, verdicts: dict[int, bool], model: Any = Model, **fields: Any) -> None:
    verdicts[n] = successes.finish(model, job(n), release_hold=False, **{
        "status": "succeeded", "finished_at": utcnow(), "result": None, "last_error": None, **fields})


def run_meeting(statements: Statements, successes: Successes, others: int) -> dict[int, bool]:
    """Job 0 writes alone and is held there while jobs 1..others queue; then it is let go."""
    verdicts: dict[int, bool] = {}
    first = threading.Thread(target=succeed, args=(successes, 0, verdicts))
    first.start()
    assert statements.entered.wait(5)
    threads = [threading.Thread(target=succeed, args=(successes, n, verdicts)) for n in range(1, others + 1)]
    for thread in threads:
        thread.start()
    while len(successes._queued) < others:  # all queued behind the write under way
        threading.Event().wait(0.005)
    statements.release.set()
    for thread in [first, *threads]:
        thread.join(5)
    return verdicts


def test_a_thread_alone_writes_its_own_success_at_once(monkeypatch):
    statements = Statements(monkeypatch)
    statements.release.set()
    verdicts: dict[int, bool] = {}
    succeed(Successes(), 7, verdicts)
    assert verdicts == {7: True} and statements.alone == [7] and statements.shared == []


def test_successes_that_meet_a_write_under_way_share_the_next(monkeypatch):
    statements = Statements(monkeypatch)
    statements.refused = {3}
    verdicts = run_meeting(statements, Successes(), 4)
    assert statements.alone == [0] and [sorted(ids) for ids in statements.shared] == [[1, 2, 3, 4]]
    assert verdicts == {0: True, 1: True, 2: True, 3: False, 4: True}  # each its own verdict


def test_a_failed_shared_write_leaves_each_success_to_its_own_thread(monkeypatch):
    statements = Statements(monkeypatch, shared_fails=True)
    verdicts = run_meeting(statements, Successes(), 3)
    assert len(statements.shared) == 1 and sorted(statements.alone) == [0, 1, 2, 3]
    assert verdicts == {0: True, 1: True, 2: True, 3: True}


@pytest.mark.parametrize("fields", [{"status": "failed", "last_error": "boom"}, {"status": "retrying"}],
                         ids=["failure", "retry"])
def test_a_failure_or_a_retry_is_written_alone(monkeypatch, fields):
    statements = Statements(monkeypatch)
    statements.release.set()
    verdicts: dict[int, bool] = {}
    succeed(Successes(), 5, verdicts, **fields)
    assert statements.alone == [5] and statements.shared == []


def test_a_success_in_a_sqlite_store_is_written_alone(monkeypatch):
    class SqliteModel(JobModel):
        class Meta:
            database = pw.SqliteDatabase(":memory:")

    statements = Statements(monkeypatch)
    statements.release.set()
    verdicts: dict[int, bool] = {}
    succeed(Successes(), 6, verdicts, model=SqliteModel)
    assert statements.alone == [6] and statements.shared == []
