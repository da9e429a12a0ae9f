"""The re-drive sets right a row in a combination of columns that no state allows (durable/redrive.py).

No path of the suite is known to leave one; each is written here by hand, as an unknown path
would leave it, with the job's message gone from the broker.  Without the repair, no waker and
no re-drive step would ever take the job again.  Real Redis broker, SQLite and PostgreSQL.
"""

from __future__ import annotations

import logging

import pytest

import dramatiq_unique
from dramatiq_unique import JobModel
from dramatiq_unique.storage.models import utcnow
from tests.durable import broker_messages, running_worker, wipe_broker
from tests.helpers import job_of, wait_until

#: The row's fields of each combination (on a job sent, never run, its message wiped).
STRANDED = {
    # A parked row that an outcome wrote over: what a taken-over attempt's record left.
    "retrying and parked": dict(status="retrying", parked_on="lock:charge:k", enqueued_at=None, lease_until=None),
    "running without a lease": dict(status="running", lease_until=None, attempts=1, worker="gone:1"),
    "pending without a due time": dict(status="pending", process_after=None, enqueued_at=None),
    "queued without the time it was sent": dict(status="queued", enqueued_at=None),
}


@pytest.mark.parametrize("case", list(STRANDED))
def test_a_row_in_a_state_with_no_way_out_is_repaired_and_its_job_runs(fast, broker, charge, case, caplog):
    message = charge.send(7)
    wipe_broker(broker)
    JobModel.update(**STRANDED[case]).where(JobModel.message_id == message.message_id).execute()
    if "time" not in case:  # long overdue, as such a row would be by the time anyone looks
        JobModel.update(process_after=utcnow()).where(JobModel.message_id == message.message_id).execute()

    def sent_again() -> bool:
        dramatiq_unique.redrive(broker)
        return any(m["message_id"] == message.message_id for m in broker_messages(broker))

    with caplog.at_level(logging.ERROR, logger="dramatiq_unique.durable.redrive"):
        wait_until(sent_again, timeout=15, interval=0.15, what="the re-drive to send the job again")
    assert any("a state nothing takes it out of" in r.getMessage() and message.message_id in r.getMessage()
               for r in caplog.records), "the repair is logged as an error"
    with running_worker(broker):
        wait_until(lambda: job_of(message).status == "succeeded", timeout=15, what="the job to run")
    job = job_of(message)
    assert job.parked_on is None and job.result == 7


def test_a_row_whose_state_has_its_way_out_is_left_alone(fast, broker, charge, caplog):
    """A parked pending row, a running one with a lease, a queued one: nothing to repair."""
    messages = [charge.send(n) for n in range(3)]
    JobModel.update(status="pending", parked_on="lock:charge:k").where(
        JobModel.message_id == messages[0].message_id).execute()
    JobModel.update(status="running", lease_until=utcnow(), attempts=1).where(
        JobModel.message_id == messages[1].message_id).execute()
    with caplog.at_level(logging.ERROR, logger="dramatiq_unique.durable.redrive"):
        counts = dramatiq_unique.redrive(broker)
    assert counts.repaired == 0 and not caplog.records
    assert counts.woken == 1, "the parked row's group has no holder: woken, the way out of its state"
