"""A unique job refused before it starts is failed with its reason, and frees its key.

Refused: ``AgeLimit``'s skip, a ``SkipMessage`` from another middleware (before the
suite's hooks, or after the job's start), a start that failed until ``Retries`` gave up.
The suite's own skips (parking, dropped copies) are not failures.  Real Redis broker,
SQLite and PostgreSQL.
"""

from __future__ import annotations

import threading
from typing import Any

import dramatiq
import pytest
from dramatiq import Middleware
from dramatiq.middleware import AgeLimit, SkipMessage

import dramatiq_unique
from tests.durable import RedisServer, running_worker
from tests.helpers import wait_until

QUEUE_LOCKS = ["until_executed", "until_executing", "until_and_while_executing"]


def job_of(message: Any):
    return dramatiq_unique.get_job(message.message_id)


def queue_lock(suite: Any, redis_client: Any, job: Any) -> Any:
    return redis_client.get(f"redlock:{suite.keys.queue_lock(job.unique_key)}")


def assert_key_is_free(work: Any, first: Any) -> Any:
    """A new send of the same key is a new job at once, and it runs."""
    again = work.send("k")
    assert again.message_id != first.message_id
    wait_until(lambda: job_of(again).status == "succeeded", timeout=15)
    return again


class Refuser(Middleware):
    """Skips the messages of one actor in before_process_message, as a third-party middleware might."""

    def __init__(self, actor_name: str) -> None:
        self.actor_name = actor_name
        self.armed = True

    def before_process_message(self, broker: Any, message: Any) -> None:
        if self.armed and message.actor_name == self.actor_name:
            self.armed = False
            raise SkipMessage("cancelled by the operator")


@pytest.mark.parametrize("lock", QUEUE_LOCKS)
def test_a_job_agelimit_skips_is_failed_and_frees_its_key(suite, broker, redis_client, lock):
    assert any(isinstance(m, AgeLimit) for m in broker.middleware)
    runs = []

    @dramatiq.actor(unique_args=["key"], unique_lock=lock, max_age=1)
    def work(key):
        runs.append(key)

    first = work.send("k")
    assert queue_lock(suite, redis_client, job_of(first)) is not None
    with running_worker(broker):
        wait_until(lambda: job_of(first).status == "failed", timeout=15)
        job = job_of(first)
        assert job.last_error.startswith("SkipMessage: Message age limit exceeded") and job.finished_at
        assert job.unique_hold is None and queue_lock(suite, redis_client, job) is None
        work.options["max_age"] = None  # the next one is young enough
        assert_key_is_free(work, first)
    assert runs == ["k"]


@pytest.mark.parametrize("where", ["before", "after"])
def test_a_job_another_middleware_skips_is_failed_and_frees_its_key(suite, broker, redis_client, where):
    """``before``: the skip comes before the suite's hooks; ``after``: after the job's start."""
    refuser = Refuser("work")
    if where == "before":
        broker.add_middleware(refuser, before=AgeLimit)
    else:
        broker.add_middleware(refuser)  # last: after JobTracking started the row
    runs = []

    @dramatiq.actor(unique_args=["key"], unique_lock="until_and_while_executing")
    def work(key):
        runs.append(key)

    first = work.send("k")
    with running_worker(broker):
        wait_until(lambda: job_of(first).status == "failed", timeout=15)
        job = job_of(first)
        assert job.last_error.startswith("SkipMessage") and job.unique_hold is None
        assert job.attempts == (0 if where == "before" else 1)
        lock = f"redlock:{suite.keys.execution_lock(job.unique_key)}"
        wait_until(lambda: redis_client.get(lock) is None, timeout=5, what="the execution lock is released")
        assert_key_is_free(work, first)
    assert runs == ["k"]


def test_the_suites_own_skips_neither_fail_a_job_nor_free_its_key(suite, broker):
    """A job parked behind its key's running job, then woken, is not a refused job."""
    release = threading.Event()
    runs = []

    @dramatiq.actor(unique_args=["key"], unique_lock="while_executing")
    def work(key, n):
        runs.append(n)
        if n == 1:
            release.wait(10)

    with running_worker(broker, threads=2):
        first = work.send("k", 1)
        wait_until(lambda: runs == [1], timeout=10)
        second = work.send("k", 2)
        wait_until(lambda: job_of(second).parked_on is not None, timeout=15, what="the second job parks")
        assert job_of(second).status == "pending"
        release.set()
        wait_until(lambda: job_of(first).status == job_of(second).status == "succeeded", timeout=15)
    assert runs == [1, 2]


@pytest.mark.slow
@pytest.mark.parametrize("lock", ["until_executed", "until_and_while_executing"])
def test_a_start_refused_until_retries_ran_out_fails_with_the_cause_and_frees_its_key(
    broker, database_url, key_prefix, lock
):
    """Given the locks' Redis down when the job is delivered (max_retries=0), then its row is
    failed with RedisUnavailable and its key freed: once Redis is back, a new send is a new job."""
    server = RedisServer().start()
    try:
        suite = dramatiq_unique.setup(broker, database=database_url, redis=server.url, key_prefix=key_prefix,
                                      redriver=False)
        runs = []

        @dramatiq.actor(unique_args=["key"], unique_lock=lock, max_retries=0,
                        **({"concurrency_limit": 2} if lock == "until_executed" else {}))
        def work(key):
            runs.append(key)

        first = work.send("k")
        server.stop()
        with running_worker(broker):
            wait_until(lambda: job_of(first).status == "failed", timeout=20)
            job = job_of(first)
            assert job.last_error.startswith("RedisUnavailable: Redis could not be reached"), job.last_error
            assert job.unique_hold is None and job.attempts == 0
            server.start()
            assert_key_is_free(work, first)
        assert runs == ["k"]
        suite.db.close()
    finally:
        server.stop()


@pytest.mark.slow
def test_a_refused_start_that_retries_will_send_again_notes_the_cause(broker, database_url, key_prefix):
    """While Retries keeps sending it again, the waiting row's last_error says why it waits."""
    server = RedisServer().start()
    try:
        suite = dramatiq_unique.setup(broker, database=database_url, redis=server.url, key_prefix=key_prefix,
                                      redriver=False)

        @dramatiq.actor(unique_args=["key"], unique_lock="while_executing", max_retries=5,
                        min_backoff=60_000, max_backoff=60_000)
        def work(key):
            pass

        first = work.send("k")
        server.stop()
        with running_worker(broker):
            wait_until(lambda: job_of(first).last_error, timeout=20)
            job = job_of(first)
            assert job.status == "queued" and job.last_error.startswith("RedisUnavailable: "), job.last_error
        suite.db.close()
    finally:
        server.stop()

