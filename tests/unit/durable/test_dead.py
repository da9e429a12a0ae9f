"""The dead set's arguments and the retry count of a retried job (no service needed)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

import dramatiq_unique
from dramatiq_unique.context import MARKER
from dramatiq_unique.durable.dead import since_of
from dramatiq_unique.durable.messages import RETRY_BASE, retries_so_far
from dramatiq_unique.storage.models import FINISHED, JobModel, JobStatus


@pytest.mark.parametrize("limit", [0, -1])
def test_a_limit_below_one_is_refused(limit):
    with pytest.raises(ValueError, match="at least 1"):
        dramatiq_unique.dead_jobs(limit=limit)


@pytest.mark.parametrize("limit", [1.5, "10", True, None])
def test_a_limit_must_be_an_int(limit):
    with pytest.raises(TypeError, match="limit"):
        dramatiq_unique.dead_jobs(limit=limit)


def test_since_is_a_datetime_in_utc_or_a_timedelta_ago():
    now = datetime(2026, 1, 2, 12, 0)
    assert since_of(None) is None
    assert since_of(timedelta(hours=1), now) == datetime(2026, 1, 2, 11, 0)
    assert since_of(now) == now  # naive: already UTC
    aware = datetime(2026, 1, 2, 14, 0, tzinfo=timezone(timedelta(hours=2)))
    assert since_of(aware) == now
    with pytest.raises(TypeError, match="since"):
        dramatiq_unique.dead_jobs(since="yesterday")  # type: ignore[arg-type]


def test_actor_name_must_be_a_str():
    with pytest.raises(TypeError, match="actor_name"):
        dramatiq_unique.dead_jobs(actor_name=3)  # type: ignore[arg-type]


def test_errors_are_the_suites_and_name_the_job():
    assert issubclass(dramatiq_unique.JobNotFound, LookupError)
    assert issubclass(dramatiq_unique.JobStateError, dramatiq_unique.DramatiqUniqueError)
    job = JobModel(message_id="m", status="running")
    assert dramatiq_unique.JobStateError("running", job=job).job is job


def test_cancelled_is_finished_and_keeps_the_order_the_sql_relies_on():
    assert FINISHED[:2] == ("succeeded", "failed") and JobStatus.CANCELLED.value in FINISHED


def test_a_retried_job_starts_a_new_retry_count():
    assert retries_so_far(JobModel(attempts=3, options={})) == 3
    assert retries_so_far(JobModel(attempts=3, options={MARKER: {RETRY_BASE: 2}})) == 1
    assert retries_so_far(JobModel(attempts=2, options={MARKER: {"qt": "m", RETRY_BASE: 2}})) == 0
