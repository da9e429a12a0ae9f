"""The dead set: dead_jobs(), retry_job(), cancel_job().

Real Redis broker and workers, on SQLite and PostgreSQL.  Actors fail on
purpose with ``max_retries`` of 0 or 1 and a 10 ms back-off, so a job is dead
within a second.
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import dramatiq
import pytest

import dramatiq_unique
from dramatiq_unique import DuplicateJob, JobModel, JobNotFound, JobStateError, checkpoint
from dramatiq_unique.durable.messages import build_message
from tests.durable import broker_messages, passes, running_worker, total, wipe_broker
from tests.helpers import LOST_AFTER, job_of, queue_lock_of, queue_size, wait_until

FAST_RETRY = dict(min_backoff=10, max_backoff=10)


def status_of(message, status: str, timeout: float = 10) -> JobModel:
    return wait_until(lambda: (job := job_of(message)) is not None and job.status == status and job,
                      timeout=timeout, what=f"job {message.message_id} {status}")


def test_jobs_out_of_retries_form_the_dead_set_newest_first(suite, broker):
    @dramatiq.actor(track=True, max_retries=1, **FAST_RETRY)
    def flaky(n):
        raise RuntimeError(f"boom {n}")

    @dramatiq.actor(track=True, max_retries=0)
    def other(n):
        raise ValueError(n)

    @dramatiq.actor(track=True)
    def fine():
        pass

    ok = fine.send()
    with running_worker(broker, threads=1):
        dead = []
        for actor, n in ((flaky, 1), (other, 2), (flaky, 3)):  # one at a time: a known finishing order
            dead.append(status_of(actor.send(n), "failed"))
        status_of(ok, "succeeded")
    assert [j.attempts for j in dead] == [2, 1, 2] and "boom 1" in dead[0].last_error

    listed = dramatiq_unique.dead_jobs()
    assert [j.message_id for j in listed] == [j.message_id for j in reversed(dead)]  # the last to fail first
    assert [j.args for j in dramatiq_unique.dead_jobs(actor_name="flaky")] == [[3], [1]]
    assert [j.args for j in dramatiq_unique.dead_jobs(limit=2)] == [[3], [2]]
    assert [j.args for j in dramatiq_unique.dead_jobs(since=dead[1].finished_at)] == [[3], [2]]
    assert len(dramatiq_unique.dead_jobs(since=timedelta(minutes=5))) == 3
    assert dramatiq_unique.dead_jobs(since=timedelta(0)) == []
    assert dramatiq_unique.dead_jobs(actor_name="fine") == []


def test_a_job_lost_under_on_lost_fail_is_in_the_dead_set(fast, broker):
    fast.settings.on_lost = "fail"

    @dramatiq.actor(track=True)
    def report():
        pass

    message = report.send()
    wipe_broker(broker)
    time.sleep(LOST_AFTER / 1000 + 0.05)
    assert total(passes(2), "failed") == 1
    [job] = dramatiq_unique.dead_jobs()
    assert job.message_id == message.message_id and "lost while waiting" in job.last_error


def test_retry_job_runs_a_dead_job_again_as_the_same_job(suite, broker):
    """Attempts go on, checkpoints stay, Retries starts a new count: max_retries=1 gives the
    manual attempt one retry again, and an older copy of the message is skipped."""
    state = {"fail": True, "steps": 0}
    runs = []

    def step() -> str:
        state["steps"] += 1
        return "done"

    @dramatiq.actor(track=True, max_retries=1, **FAST_RETRY)
    def job():
        checkpoint("first", step)
        runs.append(dramatiq_unique.current_job().attempts)
        if state["fail"]:
            raise RuntimeError("not yet")
        return "ok"

    message = job.send()
    with running_worker(broker):
        dead = status_of(message, "failed")
        assert dead.attempts == 2 and dead.checkpoints == {"first": "done"}

        again = dramatiq_unique.retry_job(message.message_id)
        assert again.status in ("queued", "running", "retrying", "failed") and again.revision == dead.revision + 1
        wait_until(lambda: len(runs) == 4, timeout=10, what="two more attempts")  # a new count: one retry again
        twice = status_of(message, "failed")
        assert twice.attempts == 4 and twice.finished_at > dead.finished_at

        state["fail"] = False
        dramatiq_unique.retry_job(twice.id)  # by numeric id
        done = status_of(message, "succeeded")
        # An older copy of the message (a redelivery of the dead attempt) is skipped, not run, and so
        # is a second delivery of the retried one.
        broker.enqueue(build_message(dead))
        broker.enqueue(build_message(done))
        time.sleep(0.3)
    assert runs == [1, 2, 3, 4, 5] and state["steps"] == 1  # the checkpoint was not redone
    assert done.attempts == 5 and done.result == "ok" and done.message_id == message.message_id
    assert job_of(message).status == "succeeded" and dramatiq_unique.dead_jobs() == []


def test_retry_job_takes_the_key_again_or_names_its_new_holder(suite, broker, redis_client):
    @dramatiq.actor(unique_args=["n"], unique_lock="until_executed", max_retries=0)
    def charge(n):
        if n < 0:
            raise RuntimeError("declined")

    first = charge.send(-1)
    with running_worker(broker):
        status_of(first, "failed")
    second = charge.send(-1)  # the key was freed: a new job holds it now
    assert second.message_id != first.message_id

    with pytest.raises(DuplicateJob) as raised:
        dramatiq_unique.retry_job(first.message_id)
    assert raised.value.job.message_id == second.message_id
    assert job_of(first).status == "failed" and job_of(first).unique_hold is None

    cancelled = dramatiq_unique.cancel_job(second.message_id)
    assert cancelled.status == "cancelled" and cancelled.unique_hold is None
    assert queue_lock_of(suite, redis_client, second.message_id) is None

    retried = dramatiq_unique.retry_job(first.message_id)
    assert retried.status == "queued" and retried.unique_hold == retried.unique_key
    assert queue_lock_of(suite, redis_client, first.message_id) == first.message_id.encode()
    assert charge.send(-1).message_id == first.message_id  # a duplicate of the retried job again


def test_only_a_failed_job_can_be_retried_and_only_a_known_one(suite, broker):
    @dramatiq.actor(track=True)
    def job():
        pass

    message = job.send()
    with pytest.raises(JobStateError) as raised:
        dramatiq_unique.retry_job(message.message_id)
    assert raised.value.job.status == "queued" and "only a failed job" in str(raised.value)
    with pytest.raises(JobNotFound):
        dramatiq_unique.retry_job("no-such-message")
    with pytest.raises(LookupError):
        dramatiq_unique.cancel_job(10**9)


def test_a_cancelled_queued_job_is_skipped_and_its_key_is_free(suite, broker, redis_client):
    runs = []

    @dramatiq.actor(unique_args=["n"])
    def sync(n, label):
        runs.append(label)

    message = sync.send(1, "cancelled")
    assert queue_lock_of(suite, redis_client, message.message_id) is not None
    job = dramatiq_unique.cancel_job(message.message_id)
    assert (job.status, job.unique_hold, job.revision) == ("cancelled", None, 1) and job.finished_at
    assert redis_client.get(f"redlock:{suite.keys.queue_lock(job.unique_key)}") is None
    again = sync.send(1, "new")  # the key is free: a new job
    assert again.message_id != message.message_id

    with running_worker(broker):
        status_of(again, "succeeded")
        wait_until(lambda: queue_size(broker) == 0, timeout=10, what="the cancelled message to arrive")
        time.sleep(0.1)
    assert runs == ["new"]
    job = job_of(message)
    assert job.status == "cancelled" and job.attempts == 0 and job.last_error is None
    assert dramatiq_unique.dead_jobs() == []
    with pytest.raises(JobStateError):
        dramatiq_unique.cancel_job(message.message_id)  # finished
    with pytest.raises(JobStateError):
        dramatiq_unique.retry_job(message.message_id)  # not failed


def test_a_delayed_job_and_a_pending_one_are_cancelled(fast, broker):
    runs = []

    @dramatiq.actor(track=True)
    def later(n):
        runs.append(n)

    delayed = later.send_with_options(args=(1,), delay=200)
    pending = later.send(2)
    model = type(job_of(pending))
    # As an outbox row whose publish failed: pending, the re-drive's to send (its message is still here).
    model.update(status="pending", enqueued_at=None).where(model.message_id == pending.message_id).execute()
    assert dramatiq_unique.cancel_job(delayed.message_id).status == "cancelled"
    assert dramatiq_unique.cancel_job(job_of(pending).id).status == "cancelled"
    later.send_with_options(args=(3,), delay=200)
    with running_worker(broker):
        time.sleep(LOST_AFTER / 1000 + 0.3)
        assert total(passes(2), "sent") == 0
        wait_until(lambda: runs == [3] and queue_size(broker) == 0, timeout=10)
        time.sleep(0.1)
    assert runs == [3] and job_of(delayed).status == job_of(pending).status == "cancelled"


def test_a_parked_slot_waiter_is_cancelled_and_the_group_goes_on(suite, broker):
    release = threading.Event()
    runs = []

    @dramatiq.actor(concurrency_limit=1, concurrency_key=["tenant"])
    def work(tenant, n):
        runs.append(n)
        if n == 0:
            release.wait(10)

    holder = work.send("t", 0)
    with running_worker(broker, threads=4):
        wait_until(lambda: runs == [0], timeout=10)
        waiter, behind = work.send("t", 1), work.send("t", 2)
        wait_until(lambda: all(job_of(m).parked_on for m in (waiter, behind)), timeout=10, what="both to park")
        with pytest.raises(JobStateError) as raised:
            dramatiq_unique.cancel_job(holder.message_id)
        assert raised.value.job.status == "running"
        job = dramatiq_unique.cancel_job(waiter.message_id)
        assert (job.status, job.parked_on) == ("cancelled", None)
        release.set()
        status_of(behind, "succeeded")
        assert work.send("t", 3) and status_of(holder, "succeeded")
        wait_until(lambda: runs == [0, 2, 3], timeout=10)
    assert job_of(waiter).status == "cancelled" and runs == [0, 2, 3]


def test_another_apps_job_is_not_found(suite, broker):
    @dramatiq.actor(track=True, max_retries=0)
    def job():
        raise RuntimeError

    message = job.send()
    with running_worker(broker):
        dead = status_of(message, "failed")
    type(dead).update(app="another").where(type(dead).id == dead.id).execute()
    assert dramatiq_unique.dead_jobs() == []
    for operation in (dramatiq_unique.retry_job, dramatiq_unique.cancel_job):
        with pytest.raises(JobNotFound):
            operation(message.message_id)


# -- attacks ---------------------------------------------------------------------------


def test_two_retries_at_once_send_the_job_once(suite, broker):
    runs = []

    @dramatiq.actor(track=True, max_retries=0)
    def job():
        runs.append(1)
        if len(runs) == 1:
            raise RuntimeError

    message = job.send()
    with running_worker(broker):
        status_of(message, "failed")
    outcomes: list = []
    barrier = threading.Barrier(4)

    def retry() -> None:
        barrier.wait(5)
        try:
            outcomes.append(dramatiq_unique.retry_job(message.message_id).revision)
        except JobStateError as e:
            outcomes.append(type(e).__name__)
        finally:
            suite.close()

    threads = [threading.Thread(target=retry) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert sorted(map(str, outcomes)) == ["1", "JobStateError", "JobStateError", "JobStateError"]
    assert len(broker_messages(broker)) == 1
    with running_worker(broker):
        status_of(message, "succeeded")
    assert len(runs) == 2


def test_cancel_racing_a_worker_start_never_both_cancels_and_runs(suite, broker):
    runs: set = set()

    @dramatiq.actor(track=True)
    def job(n):
        runs.add(n)

    cancelled, refused = set(), set()
    with running_worker(broker, threads=4):
        sent = [job.send(n) for n in range(40)]
        for n, message in enumerate(sent):
            try:
                dramatiq_unique.cancel_job(message.message_id)
                cancelled.add(n)
            except JobStateError:
                refused.add(n)
        wait_until(lambda: queue_size(broker) == 0 and all(
            job_of(m).status in ("succeeded", "cancelled") for m in sent), timeout=15)
        time.sleep(0.1)
    assert cancelled | refused == set(range(40)) and not cancelled & runs
    assert runs == refused and {job_of(sent[n]).status for n in cancelled} <= {"cancelled"}


def test_a_retry_the_broker_refuses_is_left_pending_for_the_redrive(fast, broker, monkeypatch):
    runs = []

    @dramatiq.actor(unique_args=["n"], unique_lock="until_executed", max_retries=0)
    def job(n):
        runs.append(n)
        if len(runs) == 1:
            raise RuntimeError

    message = job.send(1)
    with running_worker(broker):
        status_of(message, "failed")

    def down(*args, **kwargs):
        raise ConnectionError("broker down")

    with monkeypatch.context() as patched:
        patched.setattr(broker, "enqueue", down)
        row = dramatiq_unique.retry_job(message.message_id)
    assert (row.status, row.enqueued_at, row.unique_hold) == ("pending", None, row.unique_key)
    assert job.send(1).message_id == message.message_id  # it holds its key meanwhile
    with running_worker(broker):
        assert total(passes(1), "sent") == 1
        done = status_of(message, "succeeded")
    assert runs == [1, 1] and done.attempts == 2


def test_a_retried_job_whose_lost_attempt_was_alive_runs_and_frees_its_key(fast, broker):
    """Lost under on_lost="fail" while its attempt was in fact alive, then retried: the old
    attempt finishes first, but cannot write over the retry (its fencing token is old), so
    the retry runs and frees its key, which it would otherwise keep as a finished job."""
    fast.settings.on_lost = "fail"
    release = threading.Event()
    started = []

    @dramatiq.actor(unique_args=["n"], unique_lock="until_executing", unique_ttl=200, max_retries=0)
    def slow(n):
        started.append(n)
        if len(started) == 1:
            release.wait(10)

    message = slow.send(1)
    with running_worker(broker, threads=1):  # one thread: the retry starts after the old attempt ends
        wait_until(lambda: started, timeout=10)
        wipe_broker(broker)
        time.sleep(0.2 + LOST_AFTER / 1000 + 0.05)
        assert total(passes(2), "failed") == 1
        assert dramatiq_unique.retry_job(message.message_id).unique_hold is not None
        release.set()
        wait_until(lambda: len(started) == 2, timeout=10, what="the retry to run")
        done = status_of(message, "succeeded")
    assert done.attempts == 2 and done.unique_hold is None
    assert slow.send(1).message_id != message.message_id  # the key is free


def test_cancelling_parked_waiters_while_the_slot_is_handed_on_never_stalls_the_group(suite, broker):
    runs: set = set()

    @dramatiq.actor(concurrency_limit=1, concurrency_key=["tenant"])
    def work(tenant, n):
        runs.add(n)
        time.sleep(0.005)

    cancelled, refused = set(), set()
    with running_worker(broker, threads=4):
        sent = [work.send("t", n) for n in range(30)]
        for n in range(1, 30, 2):
            try:
                dramatiq_unique.cancel_job(sent[n].message_id)
                cancelled.add(n)
            except JobStateError:
                refused.add(n)
        wait_until(lambda: all(job_of(m).status in ("succeeded", "cancelled") for m in sent), timeout=15,
                   what="every job to finish or be cancelled")
    assert not cancelled & runs and runs == set(range(0, 30, 2)) | refused
