"""Idempotency keys and submit() (dramatiq_unique.unique.send), on SQLite and PostgreSQL."""

from __future__ import annotations

import threading
import time
from typing import Optional

import dramatiq
import pytest

import dramatiq_unique
from dramatiq_unique import IdempotencyKeyReused, InvalidOption, JobModel, get_job, ops, submit
from dramatiq_unique.storage.models import after_ms
from tests.helpers import queue_size, wait_until


@pytest.fixture
def refund(suite):
    @dramatiq.actor(track=True)
    def refund(charge_id, amount):
        return {"refunded": amount}

    return refund


def test_the_same_key_returns_the_same_job_and_sends_once(suite, broker, refund):
    job, created = submit(refund, "ch_1", 500, idempotency_key="req-1", owner="alice")
    again, created_again = submit(refund, "ch_1", 500, idempotency_key="req-1", owner="alice")
    assert (created, created_again) == (True, False)
    assert again.id == job.id and again.idempotency_key == "req-1" and again.owner == "alice"
    assert queue_size(broker) == 1


def test_keys_are_scoped_by_owner_and_actor(suite, broker, refund):
    @dramatiq.actor(track=True)
    def other(charge_id, amount):
        pass

    a, _ = submit(refund, "ch_1", 500, idempotency_key="req-1", owner="alice")
    b, created = submit(refund, "ch_1", 500, idempotency_key="req-1", owner="bob")
    c, created_c = submit(other, "ch_1", 500, idempotency_key="req-1", owner="alice")
    assert created and created_c and len({a.id, b.id, c.id}) == 3


def test_a_finished_job_is_returned_with_its_result(suite, broker, worker, refund):
    job, _ = submit(refund, "ch_1", 500, idempotency_key="req-1")
    wait_until(lambda: dramatiq_unique.get_job(job.id).status == "succeeded", timeout=10)
    again, created = submit(refund, "ch_1", 500, idempotency_key="req-1")
    assert not created and again.id == job.id
    assert (again.status, again.result) == ("succeeded", {"refunded": 500})


def test_reusing_a_key_with_other_arguments_is_an_error(suite, broker, refund):
    job, _ = submit(refund, "ch_1", 500, idempotency_key="req-1")
    with pytest.raises(IdempotencyKeyReused) as error:
        submit(refund, "ch_1", 999, idempotency_key="req-1")
    assert error.value.job.id == job.id
    # Positional or keyword, the same arguments are the same request.
    assert submit(refund, charge_id="ch_1", amount=500, idempotency_key="req-1") [0].id == job.id


def test_eight_concurrent_submits_with_one_key_make_one_job(suite, broker, refund):
    barrier = threading.Barrier(8)
    results, errors = [], []

    def go() -> None:
        try:
            barrier.wait(10)
            results.append(submit(refund, "ch_1", 500, idempotency_key="req-1", owner="alice"))
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)
        finally:
            suite.close()

    threads = [threading.Thread(target=go) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors
    assert len({job.id for job, _ in results}) == 1
    assert sorted(created for _, created in results) == [False] * 7 + [True]
    assert JobModel.select().where(JobModel.actor_name == "refund").count() == 1
    assert queue_size(broker) == 1


def test_after_the_window_the_key_makes_a_new_job(suite, broker):
    @dramatiq.actor(track=True, idempotency_window=300)
    def ping(host):
        pass

    first, _ = submit(ping, "a", idempotency_key="k")
    assert submit(ping, "a", idempotency_key="k") == (first, False)
    time.sleep(0.4)
    second, created = submit(ping, "a", idempotency_key="k")
    assert created and second.id != first.id


def test_without_a_key_submit_follows_the_unique_options(suite, broker):
    @dramatiq.actor(unique_args=["report_id"])
    def report(report_id):
        pass

    job, created = submit(report, 1)
    dup, dup_created = submit(report, report_id=1)
    assert created and not dup_created and dup.id == job.id
    delayed, created = submit(report, 2, delay=60_000)
    assert created and delayed.process_after > delayed.created_at


def test_submit_needs_a_tracked_actor_and_a_sane_key(suite, refund):
    @dramatiq.actor
    def plain():
        pass

    with pytest.raises(InvalidOption, match="tracked actor"):
        submit(plain)
    with pytest.raises(InvalidOption, match="idempotency_key"):
        submit(refund, "ch_1", 1, idempotency_key="")


DAY = 24 * 3600 * 1000


@pytest.mark.parametrize("prune", [lambda suite, broker: dramatiq_unique.redrive(broker).pruned, ops.prune],
                         ids=["redrive", "prune_command"])
def test_pruning_keeps_a_key_for_its_actors_own_longer_window(suite, broker, prune):
    """An actor whose idempotency_window (10 days) is longer than the retention and the suite's
    window (1 day each): its finished job whose key is 3 days old is not pruned (by a re-drive
    pass, or the prune command), and submit() with the key still returns it; one whose key
    outlived 10 days is pruned, and so is a job of the actor with no key, past the retention."""
    suite.settings.retention = suite.settings.idempotency_window = DAY

    @dramatiq.actor(track=True, idempotency_window=10 * DAY)
    def invoice(order):
        return order

    def finished(days: int, key: Optional[str] = None) -> JobModel:
        job = submit(invoice, days, idempotency_key=key)[0] if key else get_job(invoice.send(days).message_id)
        when = after_ms(-days * DAY)
        JobModel.update(status="succeeded", created_at=when, finished_at=when).where(JobModel.id == job.id).execute()
        return job

    recent = finished(3, "inv-3")
    old = finished(11, "inv-11")
    plain = finished(3)
    assert prune(suite, broker) == 2
    assert get_job(old.id) is None and get_job(plain.id) is None
    again, created = submit(invoice, 3, idempotency_key="inv-3")
    assert (again.id, created) == (recent.id, False), "the key is in its actor's window: the same job"
