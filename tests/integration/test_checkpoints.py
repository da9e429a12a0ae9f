"""Checkpoints (dramatiq_unique.context): steps a retry does not redo."""

from __future__ import annotations

import dramatiq
import pytest

import dramatiq_unique
from dramatiq_unique import JobModel, LockLost, NotInJob, checkpoint, current_job, step_key
from tests.helpers import wait_until


def finished(message) -> bool:
    return dramatiq_unique.get_job(message.message_id).status in ("succeeded", "failed")


def test_a_retry_does_not_redo_a_finished_step(suite, broker, worker):
    """Given a two-step job whose second step fails once, the first step's
    function runs once, and the retry gets its stored result."""
    charges, receipts, keys = [], [], []

    def charge(amount):
        charges.append(amount)
        keys.append(step_key("charge"))
        return {"charge_id": f"ch_{len(charges)}", "amount": amount}

    def send_receipt(charge):
        receipts.append(charge["charge_id"])
        if len(receipts) == 1:
            raise ConnectionError("mail server down")
        return "sent"

    @dramatiq.actor(track=True, max_retries=3, min_backoff=20, max_backoff=50)
    def refund(amount):
        done = checkpoint("charge", charge, amount)
        checkpoint("receipt", send_receipt, done)
        return done

    message = refund.send(500)
    wait_until(lambda: finished(message), timeout=20)
    job = dramatiq_unique.get_job(message.message_id)
    assert job.status == "succeeded" and job.attempts == 2
    assert charges == [500] and receipts == ["ch_1", "ch_1"]
    assert list(job.checkpoints) == ["charge", "receipt"]
    assert job.checkpoints["charge"] == {"charge_id": "ch_1", "amount": 500}
    assert job.result == {"charge_id": "ch_1", "amount": 500}
    assert keys == [f"{message.message_id}:charge"]


def test_a_result_that_is_not_json_is_an_error_and_the_step_is_not_done(suite, broker, worker):
    @dramatiq.actor(track=True, max_retries=0)
    def bad():
        checkpoint("a", lambda: 1)
        checkpoint("b", lambda: {1, 2})

    message = bad.send()
    wait_until(lambda: finished(message), timeout=10)
    job = dramatiq_unique.get_job(message.message_id)
    assert job.status == "failed" and "NotSerializable" in job.last_error
    assert job.checkpoints == {"a": 1}


def test_a_stale_worker_cannot_record_a_step(suite, broker, worker):
    """Given an attempt whose job was taken over by a newer attempt (a newer
    fencing token), its next step is refused before it runs, and its success
    is not recorded."""
    ran = []

    @dramatiq.actor(track=True, max_retries=0)
    def slow():
        checkpoint("one", lambda: ran.append("one") or 1)
        job = current_job()
        # A newer attempt starts meanwhile (it took the key with a newer token).
        JobModel.update(fencing_token=job.fencing_token + 1, status="running").where(JobModel.id == job.id).execute()
        try:
            checkpoint("two", lambda: ran.append("two") or 2)
        except LockLost:
            ran.append("refused")
            raise

    message = slow.send()
    wait_until(lambda: "refused" in ran, timeout=10)
    worker.join()
    job = dramatiq_unique.get_job(message.message_id)
    assert ran == ["one", "refused"]
    assert job.checkpoints == {"one": 1}
    assert job.status == "running"  # the zombie recorded neither success nor failure


def test_checkpoint_outside_a_job_is_an_error(suite):
    with pytest.raises(NotInJob):
        checkpoint("x", lambda: 1)
