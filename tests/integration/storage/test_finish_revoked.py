"""jobs.finish_revoked: the outcome of an attempt whose key another job took is recorded only while
the row is still that attempt's, running and not parked.  SQLite and PostgreSQL."""

from __future__ import annotations

import pytest

from dramatiq_unique import JobModel
from dramatiq_unique.storage import jobs


def rows(suite) -> tuple[JobModel, JobModel]:
    """J, whose attempt (token 1) was revoked when K drew token 2 for the same key."""
    common = dict(actor_name="a", queue_name="default", unique_key="k", app=suite.app, status="running")
    j = JobModel.create(message_id="j", attempts=1, worker="host:1:7", fencing_token=2, **common)
    JobModel.create(message_id="k", attempts=1, worker="host:2:9", fencing_token=2, **common)
    return j, JobModel(id=j.id, message_id="j", actor_name="a", unique_key="k", attempts=1, worker="host:1:7",
                       fencing_token=1)


@pytest.mark.parametrize("moved", [None, "parked", "sent again"])
def test_a_revoked_attempt_is_recorded_only_on_its_own_running_row(suite, moved):
    j, attempt = rows(suite)
    if moved == "parked":  # a delivery parked the row behind K (its worker column left as it was)
        JobModel.update(status="pending", parked_on="lock:a:k").where(JobModel.id == j.id).execute()
    elif moved == "sent again":  # the re-drive found it lost and sent it again
        JobModel.update(status="queued", revision=JobModel.revision + 1).where(JobModel.id == j.id).execute()
    before = JobModel.get_by_id(j.id)
    recorded = jobs.finish_revoked(JobModel, attempt, release_hold=False, lease_until=None, status="retrying",
                                   last_error="LockLost")
    after = JobModel.get_by_id(j.id)
    if moved is None:
        assert recorded and (after.status, after.last_error) == ("retrying", "LockLost")
    else:
        assert not recorded, f"an outcome was written over a row {moved}"
        assert (after.status, after.parked_on, after.last_error) == (before.status, before.parked_on, None)
