"""heartbeat() and current_job() (dramatiq_unique.context), on real Redis with SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from datetime import timedelta

import dramatiq
import pytest
from dramatiq.middleware import AsyncIO

import dramatiq_unique
from dramatiq_unique import LockLost, NotInJob, current_job, heartbeat
from dramatiq_unique.redis.keys import LOCK_PREFIX
from dramatiq_unique.storage.models import utcnow
from tests.helpers import wait_until


def row(message):
    return dramatiq_unique.get_job(message.message_id)


def lock_key(suite, job) -> str:
    return f"{LOCK_PREFIX}:{suite.keys.execution_lock(job.unique_key)}"


def test_heartbeat_keeps_the_lock_past_four_times_the_ttl(suite, broker, worker):
    """Given a 400 ms lease renewed every 80 ms for 2 s, then the lock never
    lapses: the next job of the key waits the whole time, and the row's
    lease keeps moving ahead."""
    spans, lefts, leases = {}, [], []

    @dramatiq.actor(unique_args=["key"], unique_lock="while_executing", unique_ttl=400)
    def long(key, n):
        spans[n] = [time.monotonic(), None]
        if n == 1:
            deadline = time.monotonic() + 2.0
            while time.monotonic() < deadline:
                time.sleep(0.08)
                lefts.append(heartbeat())
                leases.append(dramatiq_unique.get_job(current_job().id).lease_until)
        spans[n][1] = time.monotonic()

    first = long.send("k", 1)
    wait_until(lambda: 1 in spans, timeout=10)
    second = long.send("k", 2)
    wait_until(lambda: row(second).status == "succeeded", timeout=15)
    assert row(first).status == "succeeded"
    assert spans[2][0] >= spans[1][1], "the second job waited for the first"
    # Each renewal gives a full lease back; a busy machine may take a while to answer one.
    assert len(lefts) >= 20 and all(0 < left <= 0.4 for left in lefts), lefts
    assert sorted(lefts)[len(lefts) // 2] > 0.3, lefts
    assert leases[-1] - leases[0] > timedelta(seconds=1.5) and leases[-1] > utcnow()


def test_heartbeat_has_no_limit_on_renewals(suite, broker, worker):
    counted = []

    @dramatiq.actor(unique_args=["key"], unique_lock="until_and_while_executing", unique_ttl=1000)
    def chatty(key):
        for _ in range(500):
            heartbeat()
        counted.append(500)

    message = chatty.send("k")
    wait_until(lambda: row(message).status == "succeeded", timeout=20)
    assert counted == [500]


def test_a_lost_lock_raises_lock_lost_and_a_swallowed_loss_is_no_success(suite, broker, worker, redis_client):
    """Given a job whose lock Redis loses, then heartbeat() raises LockLost (and
    again on every later call); an actor that swallows it and returns is not
    recorded as succeeded but as retrying, with the error."""
    seen = []

    @dramatiq.actor(unique_args=["key"], unique_lock="while_executing", unique_ttl=5000)
    def fragile(key):
        heartbeat()
        redis_client.delete(lock_key(suite, current_job()))  # Redis lost it
        for _ in range(2):
            try:
                heartbeat()
            except LockLost as e:
                seen.append(str(e))
        return "done anyway"

    message = fragile.send("k")
    wait_until(lambda: row(message).status not in ("queued", "running"), timeout=10)
    job = row(message)
    assert len(seen) == 2 and all("lock" in text for text in seen)
    assert job.status == "retrying" and job.result is None
    assert "LockLost" in job.last_error and job.process_after > job.started_at


def test_a_lock_lost_that_propagates_is_retried(suite, broker, worker, redis_client):
    @dramatiq.actor(unique_args=["key"], unique_lock="while_executing", max_retries=1, min_backoff=60_000,
                    max_backoff=60_000)
    def fragile(key):
        redis_client.delete(lock_key(suite, current_job()))
        heartbeat()

    message = fragile.send("k")
    # Retries marks the row retrying as it sends the retry; the error is written just after.
    wait_until(lambda: row(message).status == "retrying" and row(message).last_error, timeout=10)
    assert "LockLost" in row(message).last_error


def test_a_tracked_job_without_a_lock_renews_its_row_lease(suite, broker, worker):
    """Given a tracked actor with no execution lock, then heartbeat() renews the
    row's lease and returns about unique_ttl; if a newer attempt took the row,
    it raises LockLost."""
    out = {}

    @dramatiq.actor(track=True, unique_ttl=300)
    def tracked():
        before = dramatiq_unique.get_job(current_job().id).lease_until
        time.sleep(0.05)
        out["left"] = heartbeat()
        out["renewed"] = dramatiq_unique.get_job(current_job().id).lease_until > before
        job = current_job()
        type(job).update(fencing_token=job.fencing_token + 1).where(type(job).id == job.id).execute()
        time.sleep(0.05)  # past a tenth of the lease: the next heartbeat writes the row again
        try:
            heartbeat()
        except LockLost as e:
            out["lost"] = str(e)

    message = tracked.send()
    wait_until(lambda: "lost" in out or row(message).status not in ("queued", "running"), timeout=10)
    assert 0.25 < out["left"] <= 0.3 and out["renewed"]
    assert "newer attempt" in out["lost"]


def test_current_job_and_heartbeat_in_an_asyncio_actor(suite, broker):
    """Given an async actor (run by Dramatiq on its event-loop thread), then
    current_job() and heartbeat() work there, before and after awaits."""
    broker.add_middleware(AsyncIO())
    out = {}

    @dramatiq.actor(unique_args=["key"], unique_lock="while_executing", unique_ttl=2000)
    async def fetch(key):
        out["before"] = current_job().message_id
        await asyncio.sleep(0.05)
        out["left"] = heartbeat()
        out["after"] = (current_job().message_id, current_job().fencing_token)
        out["thread"] = type(threading.current_thread()).__name__
        return key

    worker = dramatiq.Worker(broker, worker_timeout=50, worker_threads=2)
    worker.start()
    try:
        message = fetch.send("k")
        wait_until(lambda: row(message).status == "succeeded", timeout=10)
    finally:
        worker.stop(timeout=10_000)
    job = row(message)
    assert out["before"] == out["after"][0] == message.message_id
    assert out["after"][1] == job.fencing_token and 1.5 < out["left"] <= 2.0
    assert job.result == "k" and out["thread"] == "EventLoopThread"


def test_heartbeat_outside_a_job_raises_not_in_job(suite):
    with pytest.raises(NotInJob):
        heartbeat()
    with pytest.raises(NotInJob):
        current_job()


def test_a_renewal_that_took_longer_than_the_lease_raises_lock_lost(suite, broker, worker, database_url):
    """Given a 400 ms lease whose renewal waits a second (another transaction holds the job's row: a
    stalled server, a network cut that heals, a frozen process), then heartbeat() raises LockLost
    instead of returning: counted from when it was sent, the lease may have run out before it landed."""
    from dramatiq_unique.storage.database import open_database

    ready, go, outcome = threading.Event(), threading.Event(), []

    @dramatiq.actor(track=True, unique_ttl=400, max_retries=0)
    def slow(n):
        ready.set()
        go.wait(10)
        time.sleep(0.05)  # past a tenth of the lease: the row is written, not skipped
        try:
            outcome.append(heartbeat())
        except LockLost as e:
            outcome.append(e)

    message = slow.send(1)
    assert ready.wait(10)
    other = open_database(database_url)
    table, job_id = dramatiq_unique.JobModel._meta.table_name, row(message).id
    with other.atomic():
        other.execute_sql(f'UPDATE "{table}" SET attempts = attempts WHERE id = {other.param}', [job_id])
        go.set()
        time.sleep(1.0)
    other.close()
    wait_until(lambda: outcome, timeout=10)
    assert isinstance(outcome[0], LockLost) and "longer than the lease" in str(outcome[0]), outcome
    wait_until(lambda: row(message).status != "running", timeout=10)
    assert row(message).status != "succeeded"


def test_a_start_that_took_longer_than_the_lease_does_not_run_the_actor(suite, broker, database_url):
    """Given a job whose start waits a second for its row (another transaction holds it: a stalled server,
    or a network cut whose reply arrives once it heals) with a 400 ms lease, then the actor does not run on
    that start: the attempt ends with LockLost before it, and the retry runs it."""
    from dramatiq_unique.storage.database import open_database
    from tests.durable import running_worker

    runs = []

    @dramatiq.actor(track=True, unique_ttl=400, max_retries=3, min_backoff=100, max_backoff=100)
    def late(n):
        runs.append(time.monotonic())

    message = late.send(1)
    other = open_database(database_url)
    table, job_id = dramatiq_unique.JobModel._meta.table_name, row(message).id
    # The row is held before the worker starts, so that its start cannot come first.
    with contextlib.ExitStack() as held:
        held.enter_context(other.atomic())
        other.execute_sql(f'UPDATE "{table}" SET attempts = attempts WHERE id = {other.param}', [job_id])
        with running_worker(broker):
            time.sleep(1.0)  # the worker's start waits for the row meanwhile
            held.close()  # commits: the start goes on, a second after it began
            released = time.monotonic()
            other.close()
            wait_until(lambda: row(message).status == "succeeded", timeout=20)
    job = row(message)
    assert len(runs) == 1 and job.attempts == 2, (runs, job.attempts)
    assert "longer than its lease" in json.dumps(job.history), job.history
    assert runs[0] > released


def test_a_worker_frozen_after_it_took_the_lock_does_not_fence_out_the_next_holder(suite, broker):
    """Given a delivery that took its key's execution lock and then stalled for longer than the lease
    before its start (a frozen process), while the key's next job took the lock and runs, then the stalled
    start gives up before it draws the key's fencing token: the running job is not taken over (one
    attempt), the stalled job runs after it, and the two never run at once."""
    from dramatiq_unique.middleware.job_tracking import JobTracking
    from tests.durable import running_worker

    runs: list[tuple[str, float, float]] = []
    frozen = threading.Event()

    class Freeze(dramatiq.Middleware):
        """Stalls the first delivery of job "a" between the execution lock and the start."""

        def before_process_message(self, broker, message):
            if message.args[0] == "a" and not frozen.is_set():
                frozen.set()
                time.sleep(1.2)

    broker.add_middleware(Freeze(), before=JobTracking)

    @dramatiq.actor(track=True, unique_args=["customer"], unique_lock="while_executing", unique_ttl=400,
                    max_retries=5, min_backoff=100, max_backoff=100)
    def sync(name, customer):
        began = time.monotonic()
        for _ in range(8):  # 0.8 s, a beat every 0.1 s
            heartbeat()
            time.sleep(0.1)
        runs.append((name, began, time.monotonic()))

    first = sync.send("a", 7)
    with running_worker(broker, threads=2):
        assert frozen.wait(10)
        second = sync.send("b", 7)
        wait_until(lambda: row(first).status == "succeeded" and row(second).status == "succeeded", timeout=30)
    assert row(second).attempts == 1, row(second).history
    assert sorted(name for name, _, _ in runs) == ["a", "b"], runs
    (_, a0, a1), (_, b0, b1) = sorted(runs, key=lambda run: run[0])
    assert b1 <= a0, f"the stalled job runs after the holder, never beside it: {runs}"
