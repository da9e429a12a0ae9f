"""Retry bookkeeping: Dramatiq's Retries decides, the job row records, the re-drive covers lost retries.

Real Redis broker and workers, SQLite and PostgreSQL.
"""

from __future__ import annotations

import threading
import time

import dramatiq
import peewee as pw
import pytest
from dramatiq.brokers.redis import RedisBroker

import dramatiq_unique
from dramatiq_unique import current_job
from dramatiq_unique.storage.models import utcnow
from tests.conftest import REDIS_URL
from tests.durable import RedisServer, broker_messages, passes, running_worker, total, wipe_broker
from tests.helpers import wait_until


def job_of(message):
    return dramatiq_unique.get_job(message.message_id)


def ms(delta) -> float:
    return delta.total_seconds() * 1000


def test_each_retry_records_its_attempt_error_and_a_growing_due_time(suite, broker, worker):
    """Given an actor that fails three times, then each attempt finds the row counting
    it, with the last error and a due time Dramatiq's exponential backoff chose."""
    seen = []

    @dramatiq.actor(track=True, max_retries=5, min_backoff=40, max_backoff=10_000)
    def flaky():
        job = current_job()
        seen.append((job.attempts, job.status, ms(job.process_after - job.enqueued_at), job.last_error))
        if job.attempts <= 3:
            raise ConnectionError(f"attempt {job.attempts}")
        return job.attempts

    message = flaky.send()
    wait_until(lambda: job_of(message).status == "succeeded", timeout=20)
    assert [s[0] for s in seen] == [1, 2, 3, 4] and all(s[1] == "running" for s in seen)
    delays = [s[2] for s in seen[1:]]
    # compute_backoff: min_backoff * 2**retries, times a jitter in [1, 2).
    for n, delay in enumerate(delays):
        assert 40 * 2**n - 5 <= delay <= 40 * 2 ** (n + 1) + 5, delays
    assert delays[0] < delays[2]
    assert [s[3].splitlines()[0] for s in seen[1:]] == [f"ConnectionError: attempt {n}" for n in (1, 2, 3)]
    job = job_of(message)
    assert (job.attempts, job.result, job.last_error) == (4, 4, None)


def test_a_job_waiting_for_its_retry_is_retrying_until_due(suite, broker, worker):
    @dramatiq.actor(track=True, max_retries=1, min_backoff=400, max_backoff=400)
    def flaky():
        if current_job().attempts == 1:
            raise ValueError("not yet")

    message = flaky.send()
    # Settled: Retries' own write ("retrying", due later) comes a moment before the outcome's
    # (the error, the attempt's lease cleared).
    wait_until(lambda: (lambda j: j.status == "retrying" and j.last_error)(job_of(message)), timeout=10)
    job = job_of(message)
    assert job.process_after > utcnow() and job.attempts == 1 and job.lease_until is None
    assert job.broker_ref and job.enqueued_at  # its retry message is in the broker's delay queue
    wait_until(lambda: job_of(message).status == "succeeded", timeout=10)
    assert job_of(message).started_at >= job.process_after


def test_exhausted_retries_mark_the_job_failed(suite, broker, worker):
    @dramatiq.actor(track=True, max_retries=2, min_backoff=10, max_backoff=20)
    def broken():
        raise RuntimeError(f"attempt {current_job().attempts}")

    message = broken.send()
    wait_until(lambda: job_of(message).status == "failed", timeout=10)
    job = job_of(message)
    assert job.attempts == 3 and job.last_error.startswith("RuntimeError: attempt 3")
    assert job.finished_at and job.lease_until is None
    time.sleep(0.1)
    assert broker_messages(broker) == []  # no retry left behind


def test_a_throws_exception_fails_the_job_without_retrying(suite, broker, worker):
    @dramatiq.actor(track=True, max_retries=5, min_backoff=10, throws=(PermissionError,))
    def forbidden():
        raise PermissionError("no access")

    message = forbidden.send()
    wait_until(lambda: job_of(message).status == "failed", timeout=10)
    assert job_of(message).attempts == 1 and "PermissionError: no access" in job_of(message).last_error


def test_retry_when_decides_which_errors_are_retried(suite, broker, worker):
    decisions = []

    def retry_when(retries, exception):
        decisions.append((retries, type(exception).__name__))
        return isinstance(exception, TimeoutError) and retries < 5

    @dramatiq.actor(track=True, retry_when=retry_when, min_backoff=10, max_backoff=20)
    def fetch():
        if current_job().attempts < 3:
            raise TimeoutError("slow upstream")
        raise ValueError("bad payload")

    message = fetch.send()
    wait_until(lambda: job_of(message).status == "failed", timeout=10)
    assert decisions == [(0, "TimeoutError"), (1, "TimeoutError"), (2, "ValueError")]
    job = job_of(message)
    assert job.attempts == 3 and job.last_error.startswith("ValueError: bad payload")


def test_a_lost_retry_message_is_sent_when_due_and_retries_keep_counting(suite, broker):
    """Given a job waiting for its retry whose delayed message Redis lost, the re-drive
    sends it when due; max_retries still counts the attempts made before the loss."""
    suite.settings.lost_after = 100

    @dramatiq.actor(track=True, max_retries=2, min_backoff=200, max_backoff=200)
    def broken():
        raise RuntimeError(f"attempt {current_job().attempts}")

    message = broken.send()
    with running_worker(broker):
        wait_until(lambda: job_of(message).status == "retrying", timeout=10)
    wipe_broker(broker)  # the worker is gone, and so is its retry
    job = job_of(message)
    time.sleep(max(0.0, ms(job.process_after - utcnow()) / 1000) + 0.15)
    counts = passes(2)
    assert total(counts, "redriven") == 1
    (resent,) = broker_messages(broker)
    assert resent["options"]["retries"] == 1
    with running_worker(broker):
        wait_until(lambda: job_of(message).status == "failed", timeout=10)
    assert job_of(message).attempts == 3 and "attempt 3" in job_of(message).last_error


@pytest.mark.slow
def test_a_retry_the_broker_refused_is_sent_by_the_redrive(database_url, key_prefix):
    """Given the broker goes down while a job fails, Retries cannot enqueue the retry:
    the row stays retrying with no message (enqueued_at NULL), and once the broker is
    back the re-drive sends it when due."""
    server = RedisServer().start()
    broker = RedisBroker(url=server.url, namespace=f"{key_prefix}-retry")
    dramatiq.set_broker(broker)
    suite = dramatiq_unique.setup(broker, database=database_url, redis=REDIS_URL, key_prefix=key_prefix, redriver=False)
    try:

        @dramatiq.actor(track=True, max_retries=3, min_backoff=100, max_backoff=100)
        def flaky():
            if current_job().attempts == 1:
                server.stop()  # the broker dies with the first attempt
                raise OSError("first attempt")
            return "ok"

        message = flaky.send()
        with running_worker(broker):
            # The retry's own write (retrying, enqueued) comes before its publish fails; the
            # outcome then records that nothing was published: wait, with a bound, for that.
            wait_until(lambda: job_of(message).status == "retrying" and job_of(message).enqueued_at is None,
                       timeout=10)
            job = job_of(message)
            assert job.enqueued_at is None and job.last_error.startswith("OSError: first attempt")
            server.start()
            wait_until(lambda: dramatiq_unique.redrive().sent == 1, timeout=10, interval=0.1)
            wait_until(lambda: job_of(message).status == "succeeded", timeout=15)
        assert job_of(message).attempts == 2
    finally:
        server.stop()
        broker.close()
        suite.db.close()


@pytest.mark.parametrize("kind", ["tracked", "unique"])
def test_a_time_limit_that_passes_while_the_outcome_is_written_does_not_rerun_a_success(suite, broker, kind):
    """Dramatiq's TimeLimit arms a thread until its own after hook, which runs after the suite's.  An actor done
    just before its limit, whose outcome write then waits (a row lock held elsewhere), met the limit inside the
    suite's hook: the exception escaped it, Dramatiq ran every after hook again with it, and the job recorded
    ``succeeded`` was recorded ``retrying`` and run a second time.  Now it runs once, and says so."""
    options = {"track": True} if kind == "tracked" else {"unique_args": ["n"], "unique_lock": "until_executed"}
    runs, started = [], threading.Event()

    @dramatiq.actor(time_limit=1000, max_retries=3, min_backoff=50, max_backoff=100, **options)
    def near_its_limit(n):
        runs.append(n)
        started.set()
        time.sleep(0.9)

    message = near_its_limit.send(1)
    holding = threading.Thread(target=_hold_row, args=(suite, message.message_id, started, 2.5), daemon=True)
    holding.start()
    broker.emit_after("process_boot")  # what the dramatiq CLI does: TimeLimit's watch starts
    with running_worker(broker, threads=1):
        holding.join(15)
        wait_until(lambda: job_of(message).status == "succeeded", timeout=10)
        time.sleep(1.5)  # past a retry's backoff: a second run would have started
    assert runs == [1]
    job = job_of(message)
    assert job.attempts == 1 and [h["status"] for h in job.history] == ["succeeded"], job.history


@pytest.mark.parametrize("track", [False, True])
def test_a_time_limit_that_passes_while_a_retry_is_sent_does_not_end_the_worker_thread(suite, broker, track):
    """Retries sends the retry in its after hook, which runs before the suite's (a stalled Redis holds the send
    up).  Dramatiq's TimeLimit, still armed there, raised its exception in it, which ended the worker thread: a
    worker whose threads all ended took no job again, heartbeating all along.  Now the limit is off as the actor
    returns: the next job runs, tracked or not."""
    runs: list[str] = []

    class SlowRetrySend(dramatiq.Middleware):
        def before_enqueue(self, broker, message, delay):
            if message.options.get("retries"):
                time.sleep(1.6)  # TimeLimit looks once a second

    broker.add_middleware(SlowRetrySend())
    options = {"track": True} if track else {}

    @dramatiq.actor(time_limit=200, max_retries=1, min_backoff=10, max_backoff=10, **options)
    def fails_once(n):
        runs.append(f"fails_once {current_job().attempts if track else ''}".strip())
        if len([r for r in runs if r.startswith("fails_once")]) == 1:
            raise RuntimeError("once")

    @dramatiq.actor(**options)
    def then(n):
        runs.append("then")

    fails_once.send(1)
    broker.emit_after("process_boot")  # what the dramatiq CLI does: TimeLimit's watch starts
    with running_worker(broker, threads=1):
        wait_until(lambda: len(runs) == 1, timeout=10, what="the first attempt")
        then.send(2)
        wait_until(lambda: "then" in runs and len(runs) == 3, timeout=15, what="the retry and the next job")


def _hold_row(suite, message_id: str, started: threading.Event, seconds: float) -> None:
    """Lock the job's row from another connection once its attempt started, for ``seconds``."""
    started.wait(10)
    db = suite.db
    with db.connection_context(), db.atomic():
        if isinstance(db, pw.PostgresqlDatabase):
            db.execute_sql("SELECT id FROM dramatiq_unique_jobs WHERE message_id = %s FOR UPDATE", (message_id,))
        else:  # SQLite: the write lock, which the atomic block's BEGIN IMMEDIATE took
            db.execute_sql("UPDATE dramatiq_unique_jobs SET checked_at = checked_at WHERE message_id = ?",
                           (message_id,))
        time.sleep(seconds)
