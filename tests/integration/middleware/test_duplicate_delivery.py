"""A second delivery of a running job never runs beside it.

The duplicate is written into the Redis queue as it is, with no hook run, as
Dramatiq's dead-worker requeue or a broker redelivery leaves it: same
message id, same row marker.  The first attempt keeps its lease alive with
heartbeat() until the duplicate has been handled; then it finishes.  Real
Redis broker and worker, on SQLite and PostgreSQL.
"""

from __future__ import annotations

import threading
import uuid
from typing import Any

import dramatiq
import pytest
from dramatiq import Middleware
from dramatiq.common import dq_name

import dramatiq_unique
from dramatiq_unique import heartbeat
from dramatiq_unique.storage.models import after_ms, utcnow
from tests.helpers import current_token, wait_until

CASES = {
    "until_executed": dict(unique_args=["key"], unique_lock="until_executed"),
    "until_executing": dict(unique_args=["key"], unique_lock="until_executing"),
    "until_and_while_executing": dict(unique_args=["key"], unique_lock="until_and_while_executing"),
    "while_executing": dict(unique_args=["key"], unique_lock="while_executing"),
    "until_expired": dict(unique_args=["key"], unique_lock="until_expired", unique_window=60_000),
    "track": dict(track=True),
    "slots": dict(track=True, concurrency_limit=3),
    "slots_until_executed": dict(unique_args=["key"], unique_lock="until_executed", concurrency_limit=3),
}


class Deliveries(Middleware):
    """Counts the deliveries of each message id that ended in a skip."""

    def __init__(self) -> None:
        self.skipped: dict[str, int] = {}
        self.lock = threading.Lock()

    def after_skip_message(self, broker: Any, message: Any) -> None:
        with self.lock:
            self.skipped[message.message_id] = self.skipped.get(message.message_id, 0) + 1


def deliver_again(broker: Any, message: Any) -> None:
    """The message once more in its queue, under a new broker id, as a requeue leaves it."""
    copy = message.copy(options={"redis_message_id": str(uuid.uuid4())})
    broker.do_enqueue(message.queue_name, copy.options["redis_message_id"], copy.encode())


class Runs:
    """How many attempts ran, and how many at once at most."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.active = self.most = self.done = 0
        self.started = threading.Event()
        self.release = threading.Event()

    def run(self) -> None:
        with self.lock:
            self.active += 1
            self.most = max(self.most, self.active)
        self.started.set()
        try:
            while not self.release.wait(0.05):
                heartbeat()  # the first attempt's lease stays alive: the duplicate must wait
        finally:
            with self.lock:
                self.active -= 1
                self.done += 1


def settle(broker: Any, worker: Any) -> None:
    """Wait until every copy (the delayed one included) was delivered and handled."""
    for queue in (dq_name("default"), "default"):
        broker.join(queue, timeout=30_000)
    worker.join()


@pytest.mark.parametrize("case", list(CASES))
def test_a_second_delivery_of_a_running_job_never_runs_beside_it(suite, broker, worker, case):
    seen = Deliveries()
    broker.add_middleware(seen)
    runs = Runs()

    @dramatiq.actor(unique_ttl=2000, max_retries=0, **CASES[case])
    def work(key):
        runs.run()
        return "done"

    message = work.send("k")
    assert runs.started.wait(10)
    fence_key = dramatiq_unique.get_job(message.message_id).unique_key
    token = current_token(suite.db, fence_key) if fence_key else None
    deliver_again(broker, message)
    wait_until(lambda: seen.skipped.get(message.message_id), timeout=15, what="the duplicate is handled")
    job = dramatiq_unique.get_job(message.message_id)
    assert job.status == "running" and job.attempts == 1
    if case in ("while_executing", "until_and_while_executing"):
        # The refused copy took no fencing token from the live attempt.
        assert job.fencing_token == token == current_token(suite.db, fence_key)
    runs.release.set()
    wait_until(lambda: dramatiq_unique.get_job(message.message_id).status == "succeeded", timeout=15)
    settle(broker, worker)
    job = dramatiq_unique.get_job(message.message_id)
    assert (runs.most, runs.done, job.attempts, job.status, job.result) == (1, 1, 1, "succeeded", "done")


def test_a_copy_of_a_running_job_runs_it_if_the_attempt_dies(suite, broker, worker):
    """Given a running job whose attempt stops renewing its lease (its worker died), a
    duplicate delivered meanwhile waits for the lease to run out, then runs the job."""
    seen = Deliveries()
    broker.add_middleware(seen)
    attempts = []
    refused, hang = threading.Event(), threading.Event()

    @dramatiq.actor(track=True, unique_ttl=1000, max_retries=0)
    def work():
        attempt = dramatiq_unique.current_job().attempts
        attempts.append(attempt)
        if attempt == 1:
            while not refused.wait(0.05):
                heartbeat()  # alive until the duplicate was refused...
            hang.wait(20)  # ...then no heartbeat: as good as dead once its lease runs out
        return attempt

    message = work.send()
    wait_until(lambda: attempts == [1], timeout=10)
    deliver_again(broker, message)
    wait_until(lambda: seen.skipped.get(message.message_id), timeout=15, what="the duplicate waits")
    refused.set()
    assert attempts == [1]
    wait_until(lambda: dramatiq_unique.get_job(message.message_id).status == "succeeded", timeout=20)
    job = dramatiq_unique.get_job(message.message_id)
    assert attempts == [1, 2] and job.attempts == 2 and job.result == 2
    hang.set()
    worker.join()
    # The dead attempt woke up: it is fenced out and records nothing.
    assert dramatiq_unique.get_job(message.message_id).result == 2


def test_a_retry_of_the_same_job_still_runs(suite, broker, worker):
    """Retries' own re-send (the same message id) is a new attempt, not a duplicate."""
    attempts = []

    @dramatiq.actor(track=True, unique_ttl=60_000, max_retries=3, min_backoff=10, max_backoff=20)
    def flaky():
        attempts.append(1)
        if len(attempts) < 3:
            raise RuntimeError("again")
        return len(attempts)

    message = flaky.send()
    wait_until(lambda: dramatiq_unique.get_job(message.message_id).status == "succeeded", timeout=20)
    assert dramatiq_unique.get_job(message.message_id).attempts == 3 and len(attempts) == 3


def test_a_refused_copy_that_took_the_lost_lock_revokes_nothing(suite, broker, worker, redis_client):
    """Given Redis lost a running job's execution lock, a duplicate delivery takes the lock; its
    start is still refused (the row's lease is live), and the live attempt keeps its token and
    records its outcome."""
    seen = Deliveries()
    broker.add_middleware(seen)
    runs = Runs()

    @dramatiq.actor(unique_args=["key"], unique_lock="while_executing", unique_ttl=60_000, max_retries=0)
    def work(key):
        runs.started.set()
        with runs.lock:
            runs.active += 1
            runs.most = max(runs.most, runs.active)
        runs.release.wait(15)
        with runs.lock:
            runs.active -= 1
            runs.done += 1
        return "done"

    message = work.send("k")
    assert runs.started.wait(10)
    job = dramatiq_unique.get_job(message.message_id)
    redis_client.delete(f"redlock:{suite.keys.execution_lock(job.unique_key)}")  # Redis lost it
    deliver_again(broker, message)
    wait_until(lambda: seen.skipped.get(message.message_id), timeout=15, what="the duplicate is refused")
    assert dramatiq_unique.get_job(message.message_id).fencing_token == job.fencing_token
    runs.release.set()
    wait_until(lambda: dramatiq_unique.get_job(message.message_id).status == "succeeded", timeout=15)
    job = dramatiq_unique.get_job(message.message_id)
    assert (runs.most, runs.done, job.attempts, job.result) == (1, 1, 1, "done")


@pytest.mark.parametrize("case", ["track", "until_executed", "slots"])
def test_a_burst_of_jobs_each_delivered_three_times_runs_each_once(suite, broker, worker, case):
    runs: dict[int, int] = {}
    lock = threading.Lock()

    @dramatiq.actor(unique_ttl=2000, max_retries=0, **CASES[case])
    def work(key):
        with lock:
            runs[key] = runs.get(key, 0) + 1
        for _ in range(4):
            heartbeat()
            threading.Event().wait(0.05)
        return key

    messages = []
    for n in range(12):  # each job's copies side by side in the queue: taken by threads at once
        messages.append(work.send(n))
        deliver_again(broker, messages[-1])
        deliver_again(broker, messages[-1])
    wait_until(lambda: all(dramatiq_unique.get_job(m.message_id).status == "succeeded" for m in messages),
               timeout=30)
    settle(broker, worker)
    assert runs == {n: 1 for n in range(12)}
    assert [dramatiq_unique.get_job(m.message_id).attempts for m in messages] == [1] * 12


def test_a_copy_of_the_first_message_does_not_start_a_row_its_waker_started_ahead(suite, broker):
    """Given a slot job whose row a waker's claim started ahead of the woken message's delivery
    (worker ``<id>:woken``, a live lease), When a copy of the job's first message (no wake
    reservation) is delivered, Then it is refused as a duplicate: only the woken message may
    take that start up (the burst test caught a copy running such a job a second time)."""
    seen = Deliveries()
    broker.add_middleware(seen)
    runs: list[int] = []

    @dramatiq.actor(track=True, concurrency_limit=2, unique_ttl=60_000, max_retries=0)
    def work(n):
        runs.append(n)

    message = work.send(1)
    row = dramatiq_unique.get_job(message.message_id)
    row.__class__.update(
        status="running", worker="elsewhere:1:woken", attempts=1, started_at=utcnow(),
        lease_until=after_ms(60_000), parked_on=None,
    ).where(row.__class__.id == row.id).execute()
    worker = dramatiq.Worker(broker, worker_timeout=50, worker_threads=1)
    worker.start()
    try:
        wait_until(lambda: seen.skipped.get(message.message_id), timeout=15, what="the copy is refused")
    finally:
        worker.stop()
    job = dramatiq_unique.get_job(message.message_id)
    assert runs == [] and (job.status, job.worker, job.attempts) == ("running", "elsewhere:1:woken", 1)
