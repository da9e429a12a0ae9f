"""Unit tests of the fencing tokens (storage/jobs.py) on a throw-away SQLite file (no services)."""

from __future__ import annotations

from datetime import timedelta

import peewee as pw
import pytest

from dramatiq_unique import JobModel
from dramatiq_unique.storage import jobs
from dramatiq_unique.storage.database import open_database
from dramatiq_unique.storage.models import create_fence_table, utcnow
from tests.helpers import current_token


class Jobs(JobModel):
    class Meta:
        table_name = "fencing_unit_jobs"


@pytest.fixture
def db(tmp_path):
    database = open_database(f"sqlite:///{tmp_path / 'fences.db'}")
    Jobs.bind(database, bind_refs=False, bind_backrefs=False)
    database.create_tables([Jobs])
    create_fence_table(database)
    yield database
    database.close()


def job(**fields) -> Jobs:
    n = Jobs.select().count()
    return Jobs.create(message_id=f"m{n}", actor_name="a", queue_name="default", **fields)


def test_tokens_grow_per_key_and_keys_are_independent(db):
    assert [jobs.draw_token(Jobs, "a:k") for _ in range(3)] == [1, 2, 3]
    assert jobs.draw_token(Jobs, "a:other") == 1
    assert jobs.draw_token(Jobs, "a:k") == 4
    assert current_token(db, "a:k") == 4 and current_token(db, "a:none") == 0


def test_drawing_fences_out_older_running_attempts_of_the_key(db):
    zombie = job(unique_key="a:k", status="running", fencing_token=jobs.draw_token(Jobs, "a:k"))
    done = job(unique_key="a:k", status="succeeded", fencing_token=zombie.fencing_token)
    other = job(unique_key="a:other", status="running", fencing_token=1)
    parked = job(unique_key="a:k", status="pending", parked_on="lock:a:k")

    token = jobs.draw_token(Jobs, "a:k", parked.id)

    assert Jobs.get_by_id(zombie.id).fencing_token == token > zombie.fencing_token
    assert Jobs.get_by_id(done.id).fencing_token == done.fencing_token, "finished rows keep their token"
    assert Jobs.get_by_id(other.id).fencing_token == 1, "other keys are untouched"
    mine = Jobs.get_by_id(parked.id)
    assert mine.parked_on is None and mine.fencing_token == 0, "the drawing job's row is only unparked"


def test_a_draw_inside_a_rolled_back_transaction_leaves_nothing(db):
    with pytest.raises(pw.IntegrityError):
        with db.atomic():
            jobs.draw_token(Jobs, "a:k")
            raise pw.IntegrityError("roll it back")
    assert current_token(db, "a:k") == 0


def test_no_earlier_attempt_writes_to_a_parked_row(db):
    """An attempt stalled past its lease; the re-drive found its message lost and sent the job again (queued,
    a new revision, the token as it was); the new delivery parked it.  The stalled attempt wakes: neither its
    retry (unique/enqueue.py) nor its outcome lands on the parked row, which only a waker takes out of its
    wait (else it would stay parked and retrying, a state nothing takes it out of)."""
    row = job(status="running", attempts=1, fencing_token=7, worker="h:1:2",
              lease_until=utcnow() - timedelta(seconds=5))
    Jobs.update(status="queued", revision=Jobs.revision + 1, lease_until=None).where(Jobs.id == row.id).execute()
    assert jobs.park(Jobs, row.id, 1, "lock:a:k", {}, utcnow()) is not None
    stale_retry = Jobs.update(status="retrying").where((Jobs.id == row.id) & (Jobs.fencing_token == 7))
    assert stale_retry.execute() == 0
    assert not jobs.finish(Jobs, row, release_hold=False, status="failed", finished_at=utcnow(), last_error="x")
    parked = Jobs.get_by_id(row.id)
    assert (parked.status, parked.parked_on, parked.fencing_token) == ("pending", "lock:a:k", 8)
