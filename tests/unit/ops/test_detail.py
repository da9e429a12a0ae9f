"""One job's view from its row (dramatiq_unique.ops.detail), without a store: attempts and waits."""

from __future__ import annotations

from datetime import datetime, timedelta

from dramatiq_unique.ops import detail, words
from dramatiq_unique.storage.models import JobModel, JobStatus, utcnow


def test_attempt_times_from_the_history_column_are_datetimes():
    row = JobModel(id=1, status=JobStatus.SUCCEEDED.value, attempts=2, history=[
        {"attempt": 1, "started_at": "2026-11-24T22:09:51.246", "finished_at": "2026-11-24T22:09:51.258",
         "status": "retrying", "error": "ValueError: boom", "worker": "w:1:2"},
        {"attempt": 2, "started_at": "2026-11-24T22:10:01", "finished_at": "garbage", "status": "succeeded"},
    ])
    first, second = detail.history(row)
    assert first.started_at == datetime(2026, 11, 24, 22, 9, 51, 246000)
    assert first.finished_at == datetime(2026, 11, 24, 22, 9, 51, 258000)
    assert second.started_at == datetime(2026, 11, 24, 22, 10, 1) and second.finished_at is None
    assert first.as_dict()["started_at"] == "2026-11-24T22:09:51.246000"


def test_an_overdue_retrying_job_says_so():
    row = JobModel(id=1, status=JobStatus.RETRYING.value, process_after=utcnow() - timedelta(minutes=3))
    waiting = detail.waiting_of(None, row)  # type: ignore[arg-type]  # a retrying row asks no store
    assert waiting is not None and waiting.due_in_ms is not None and waiting.due_in_ms < 0
    assert words.why(waiting) == "failed, retrying: next attempt overdue by 3 m"
