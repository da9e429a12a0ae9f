"""The history entry and its append in SQL (SQLite: the embedded database, no service)."""

from __future__ import annotations

from datetime import datetime

import peewee as pw
import pytest

from dramatiq_unique.health.target import bound
from dramatiq_unique.storage import jobs, schema
from dramatiq_unique.storage.models import JobModel


@pytest.fixture
def model(tmp_path):
    db = pw.SqliteDatabase(str(tmp_path / "jobs.db"))
    model = bound(JobModel, db, 0)
    schema.create_or_migrate(model)
    yield model
    db.close()


def test_an_entry_keeps_the_first_line_of_the_error():
    entry = jobs.history_entry(attempt=2, started_at=datetime(2026, 1, 2, 3, 4, 5, 678000), finished_at=None,
                          status="retrying", error="ValueError: boom\nTraceback...\n" + "x" * 10_000, worker="w")
    assert entry == {"attempt": 2, "started_at": "2026-01-02T03:04:05.678", "finished_at": None,
                     "status": "retrying", "error": "ValueError: boom", "worker": "w"}
    long = jobs.history_entry(attempt=1, started_at=None, finished_at=None, status="failed", error="E" * 2000,
                              worker=None)
    assert len(long["error"]) == jobs.MAX_HISTORY_ERROR


def test_the_outcome_appends_and_keeps_the_last_entries(model):
    job_id = jobs.adopt(model, {"message_id": "m", "actor_name": "a", "queue_name": "q"})[0]
    for n in range(1, jobs.MAX_HISTORY + 4):
        item = jobs.history_entry(attempt=n, started_at=None, finished_at=None, status="retrying", error=None,
                                  worker="w")
        assert jobs.update_fenced(model, job_id, 0, {"attempts": n}, attempt=item) == 1
    kept = model.get_by_id(job_id).history
    assert [e["attempt"] for e in kept] == list(range(4, jobs.MAX_HISTORY + 4))
    # A write of other columns (a checkpoint, a lease) leaves the history alone.
    jobs.update_fenced(model, job_id, 0, {"attempts": 99})
    assert len(model.get_by_id(job_id).history) == jobs.MAX_HISTORY


def test_a_fenced_out_attempt_appends_nothing(model):
    job_id = jobs.adopt(model, {"message_id": "m", "actor_name": "a", "queue_name": "q", "fencing_token": 5})[0]
    item = jobs.history_entry(attempt=1, started_at=None, finished_at=None, status="succeeded", error=None, worker="w")
    assert jobs.update_fenced(model, job_id, 4, {"status": "succeeded"}, attempt=item) == 0
    assert model.get_by_id(job_id).history is None
