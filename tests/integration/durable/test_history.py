"""The re-drive appends a lost attempt to the job's history (SQLite and PostgreSQL)."""

from __future__ import annotations

from datetime import timedelta

import dramatiq

from dramatiq_unique import JobModel
from dramatiq_unique.storage.models import utcnow
from tests.durable import passes


def _running(suite, message_id, since):
    return JobModel.create(message_id=message_id, actor_name="job", queue_name="default", app=suite.app,
                           status="running", attempts=1, started_at=since, lease_until=since, worker="gone:1:2",
                           fencing_token=1, history=[{"attempt": 0, "status": "retrying"}])


def test_a_lost_attempt_is_in_the_history(fast, broker):
    """A running row whose worker died (lease long run out, no message): re-sent under on_lost="redrive",
    failed under "fail"; either way the attempt is appended as lost, after the entries already there."""
    dramatiq.actor(lambda: None, broker=broker, actor_name="job", max_retries=3, track=True)
    since = utcnow() - timedelta(minutes=5)
    resent = _running(fast, "lost-resent", since)
    passes(suite=fast, broker=broker)
    resent = JobModel.get_by_id(resent.id)
    assert resent.status == "queued"
    assert [e["status"] for e in resent.history] == ["retrying", "lost"]
    assert resent.history[1]["attempt"] == 1 and resent.history[1]["worker"] == "gone:1:2"
    assert resent.history[1]["error"].startswith("attempt 1 lost")

    fast.settings.on_lost = "fail"
    failed = _running(fast, "lost-failed", since)
    passes(suite=fast, broker=broker)
    failed = JobModel.get_by_id(failed.id)
    assert failed.status == "failed" and failed.history[-1]["status"] == "lost"
