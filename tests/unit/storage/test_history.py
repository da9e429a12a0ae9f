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


def _entry(attempt=1, **fields):
    job = JobModel(attempts=attempt, started_at=None, worker="w")
    return jobs.attempt_of(job, {"finished_at": datetime(2026, 1, 2), **fields}, fields.get("status"))


def test_an_entry_keeps_the_first_line_of_the_error():
    job = JobModel(attempts=2, started_at=datetime(2026, 1, 2, 3, 4, 5, 678000), worker="w")
    entry = jobs.attempt_of(job, {"finished_at": datetime(2026, 1, 2, 3, 4, 6),
                                  "last_error": "ValueError: boom\nTraceback...\n" + "x" * 10_000})
    assert entry == {"attempt": 2, "started_at": "2026-01-02T03:04:05.678", "finished_at": "2026-01-02T03:04:06.000",
                     "status": "retrying", "error": "ValueError: boom", "worker": "w"}
    long = jobs.attempt_of(job, {"status": "failed", "last_error": "E" * 2000})
    assert len(long["error"]) == jobs.MAX_HISTORY_ERROR and long["status"] == "failed"


def test_the_outcome_appends_and_keeps_the_last_entries(model):
    job_id = jobs.adopt(model, {"message_id": "m", "actor_name": "a", "queue_name": "q"})[0]
    for n in range(1, jobs.MAX_HISTORY + 4):
        item = _entry(n)
        assert jobs.update_fenced(model, job_id, 0, {"attempts": n}, attempt=item) == 1
    kept = model.get_by_id(job_id).history
    assert [e["attempt"] for e in kept] == list(range(4, jobs.MAX_HISTORY + 4))
    # A write of other columns (a checkpoint, a lease) leaves the history alone.
    jobs.update_fenced(model, job_id, 0, {"attempts": 99})
    assert len(model.get_by_id(job_id).history) == jobs.MAX_HISTORY


def test_a_fenced_out_attempt_appends_nothing(model):
    job_id = jobs.adopt(model, {"message_id": "m", "actor_name": "a", "queue_name": "q", "fencing_token": 5})[0]
    item = _entry(status="succeeded")
    assert jobs.update_fenced(model, job_id, 4, {"status": "succeeded"}, attempt=item) == 0
    assert model.get_by_id(job_id).history is None
