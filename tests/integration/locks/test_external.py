"""dramatiq_unique.lock(): a pottery Redlock on a unique key's execution lock, held from outside a job.

Real Redis (the shared one, or three servers of the test's own), real
Dramatiq workers, SQLite and PostgreSQL.  Each way round: the app holds
the key and the key's jobs park, then start once it is released (or once
its lease ran out); a job holds the key and the app's Redlock sees it held.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any, Iterator

import dramatiq
import pottery
import pytest
import redis

import dramatiq_unique
from dramatiq_unique import InvalidOption, get_job
from dramatiq_unique.locks.external import KeyLock
from tests.durable import RedisServer
from tests.helpers import wait_until

#: What a job waits for at most in these tests: well below the default lease (60 s) of a lock()
#: that is never released, so a job that starts within it was woken by the release.
WAIT = 20


@pytest.fixture(autouse=True)
def _json_dumps_kept() -> Iterator[None]:
    """Importing pottery (lock()'s first use) replaces json.dumps: the rest of the run keeps the original."""
    original = json.dumps
    yield
    json.dumps = original


class Runs:
    """Each call of an actor: (arguments, time.monotonic() at its start), from any worker thread."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls: list[tuple[Any, float]] = []

    def add(self, *args: Any) -> None:
        with self.lock:
            self.calls.append((args, time.monotonic()))

    def args(self) -> list[Any]:
        with self.lock:
            return [args for args, _ in self.calls]

    def started(self, *args: Any) -> float:
        with self.lock:
            return next(at for called, at in self.calls if called == args)


def parked(message: dramatiq.Message) -> Any:
    """The job's row once it is parked (for wait_until), else None."""
    job = get_job(message.message_id)
    return job if job is not None and job.parked_on else None


def finished(message: dramatiq.Message) -> bool:
    job = get_job(message.message_id)
    return job is not None and job.status == "succeeded"


@pytest.mark.parametrize("lock_type", ["while_executing", "until_and_while_executing"])
def test_jobs_of_a_held_key_park_and_start_soon_after_its_release(suite, broker, worker, lock_type):
    """Given customer 42's key held by lock() (a 60 s lease), When jobs of 42 and of 7 are sent, Then 7's
    runs, 42's parks (its row pending on the key's group, no attempt, no retry) and does not run; once the
    lock is released it starts, long before the lease would have run out, and runs once."""
    runs = Runs()

    @dramatiq.actor(unique_args=["customer_id"], unique_lock=lock_type)
    def sync(customer_id: int, note: str) -> None:
        runs.add(customer_id, note)

    held = dramatiq_unique.lock(sync, 42)
    assert isinstance(held, pottery.Redlock) and held.auto_release_time == 60
    assert held.acquire(blocking=False)
    waiting, other = sync.send(42, "waits"), sync.send(7, "runs")
    row = wait_until(lambda: parked(waiting), timeout=WAIT, what="the job of 42 parked")
    wait_until(lambda: finished(other), timeout=WAIT, what="the job of 7, another key")
    assert (row.parked_on, row.unique_key) == (held.group, held.unique_key)
    assert (row.status, row.attempts, row.options.get("retries") or 0) == ("pending", 0, 0)
    assert runs.args() == [(7, "runs")]
    assert get_job(waiting.message_id).status == "pending", "still parked: it does not spin"
    assert held.held() > 50 and held.locked() == pytest.approx(held.held(), abs=1)

    released = time.monotonic()
    held.release()
    wait_until(lambda: finished(waiting), timeout=WAIT, what="the job of 42 after the release")
    assert runs.started(42, "waits") >= released
    assert runs.args().count((42, "waits")) == 1 and get_job(waiting.message_id).attempts == 1


def test_leaving_a_with_block_wakes_the_jobs_that_waited(suite, broker, worker):
    """``with lock(...)``: jobs of the key park inside the block, and start once it is left."""
    runs = Runs()

    @dramatiq.actor(unique_args=["customer_id"], unique_lock="while_executing")
    def sync(customer_id: int, n: int) -> None:
        runs.add(customer_id, n)

    with dramatiq_unique.lock(sync, customer_id=42) as held:
        assert isinstance(held, KeyLock) and held.held() > 0
        messages = [sync.send(42, n) for n in range(3)]
        for message in messages:
            wait_until(lambda m=message: parked(m), timeout=WAIT, what="the jobs parked")
        assert runs.args() == []
    for message in messages:
        wait_until(lambda m=message: finished(m), timeout=WAIT, what="every job after the block")
    assert runs.args() == [(42, 0), (42, 1), (42, 2)], "one at a time, in the order sent"


@pytest.mark.parametrize("lock_type", ["while_executing", "until_and_while_executing"])
def test_a_running_job_holds_its_key_against_lock(suite, broker, worker, lock_type):
    """Given a job of customer 42 running, Then lock(42).locked() sees the key held, a non-blocking
    acquire fails and a blocking one times out; lock(43) is free; once the job is done, lock(42) is too."""
    go = threading.Event()

    @dramatiq.actor(unique_args=["customer_id"], unique_lock=lock_type)
    def sync(customer_id: int) -> None:
        assert go.wait(WAIT)

    message = sync.send(42)
    wait_until(lambda: get_job(message.message_id).status == "running", timeout=WAIT, what="the job running")
    held = dramatiq_unique.lock(sync, 42)
    assert held.unique_key == get_job(message.message_id).unique_key
    assert 0 < held.locked() <= 60 and held.held() == 0
    assert not held.acquire(blocking=False)
    assert not held.acquire(timeout=0.3)
    free = dramatiq_unique.lock(sync, 43)
    assert free.unique_key != held.unique_key and free.locked() == 0
    go.set()
    wait_until(lambda: finished(message), timeout=WAIT, what="the job done")
    wait_until(lambda: held.locked() == 0, timeout=WAIT, what="the job's lock released")
    assert held.acquire(blocking=False)
    held.release()


def test_a_holder_that_never_releases_lets_the_jobs_start_after_its_lease(suite, broker, worker):
    """Given lock(42, unique_ttl=1500) taken and never released (its holder crashed), Then the parked job of
    42 starts once the lease ran out (the watchdog's look), not before; a late release raises pottery's
    ReleaseUnlockedLock and wakes nothing twice."""
    runs = Runs()

    @dramatiq.actor(unique_args=["customer_id"], unique_lock="while_executing")
    def sync(customer_id: int) -> None:
        runs.add(customer_id)

    held = dramatiq_unique.lock(sync, 42, unique_ttl=1_500)
    assert held.auto_release_time == 1.5
    assert held.acquire(blocking=False)
    taken = time.monotonic()
    message = sync.send(42)
    wait_until(lambda: parked(message), timeout=WAIT, what="the job parked")
    wait_until(lambda: finished(message), timeout=WAIT, what="the job after the lease ran out")
    assert runs.started(42) - taken >= 1.0, "not before the lease ran out"
    with pytest.raises(pottery.ReleaseUnlockedLock):
        held.release()
    assert runs.args() == [(42,)]


def test_the_key_is_the_one_a_job_of_those_arguments_takes(suite, broker):
    """lock() binds the arguments as a send does: positional or keyword, defaults filled in, only the
    unique_args counted; other values give other keys; the Redis key is the execution lock's."""

    @dramatiq.actor(unique_args=["customer_id", "region"], unique_lock="while_executing")
    def sync(customer_id: int, note: str = "", region: str = "eu") -> None:
        pass

    @dramatiq.actor(unique_args=lambda customer, *rest: f"c{customer['id']}")
    def by_callable(customer: dict, n: int) -> None:
        pass

    sent = get_job(sync.send(42, "x").message_id)
    one = dramatiq_unique.lock(sync, 42)
    assert one.unique_key == sent.unique_key
    assert one.key == f"redlock:{suite.keys.execution_lock(sent.unique_key)}"
    assert one.group == f"lock:{sent.unique_key}"
    same = [dramatiq_unique.lock(sync, customer_id=42, note="other"), dramatiq_unique.lock(sync, 42, "y", "eu")]
    assert {lk.unique_key for lk in same} == {one.unique_key}
    others = [dramatiq_unique.lock(sync, 43), dramatiq_unique.lock(sync, 42, region="us")]
    assert len({one.unique_key, *(lk.unique_key for lk in others)}) == 3
    called = get_job(by_callable.send({"id": 5}, 1).message_id)
    assert dramatiq_unique.lock(by_callable, {"id": 5}, 2).unique_key == called.unique_key

    # Held by one, refused to the other: the two are the same lock.
    assert one.acquire(blocking=False)
    try:
        assert not same[0].acquire(blocking=False) and others[0].acquire(blocking=False)
        others[0].release()
    finally:
        one.release()


def test_lock_refuses_actors_and_values_it_cannot_hold(suite, broker):
    @dramatiq.actor(track=True)
    def tracked(customer_id: int) -> None:
        pass

    @dramatiq.actor
    def plain(customer_id: int) -> None:
        pass

    @dramatiq.actor(unique_args=["customer_id"], unique_lock="until_executed")
    def queued_only(customer_id: int) -> None:
        pass

    @dramatiq.actor(unique_args=["customer_id"], unique_lock="while_executing")
    def sync(customer_id: int) -> None:
        pass

    for not_an_actor in ("sync", sync.fn):
        with pytest.raises(InvalidOption, match="takes an actor"):
            dramatiq_unique.lock(not_an_actor, 1)
    for actor in (tracked, plain):
        with pytest.raises(InvalidOption, match="has no unique_args"):
            dramatiq_unique.lock(actor, 1)
    with pytest.raises(InvalidOption, match="unique_lock='until_executed', which takes none"):
        dramatiq_unique.lock(queued_only, 1)
    for bad in (0, -5, 1.5, "1000", True):
        with pytest.raises(InvalidOption, match="unique_ttl"):
            dramatiq_unique.lock(sync, 1, unique_ttl=bad)
    with pytest.raises(InvalidOption, match="do not fit"):
        dramatiq_unique.lock(sync, 1, 2)
    with pytest.raises(InvalidOption, match="needs the arguments of .*sync's key: customer_id missing"):
        dramatiq_unique.lock(sync)
    with pytest.raises(InvalidOption, match="do not fit"):
        dramatiq_unique.lock(sync, 1, other=2)


@pytest.fixture
def servers() -> Iterator[list[RedisServer]]:
    started: list[RedisServer] = []
    try:
        for _ in range(3):
            started.append(RedisServer().start())
        yield started
    finally:
        for server in started:
            server.stop()


def test_with_three_masters_the_lock_is_held_on_a_majority_and_wakes_the_jobs(broker, sqlite_url, key_prefix,
                                                                           servers):
    """Given a suite on three Redis masters, Then lock() holds the key on a majority (pottery's Redlock over the
    suite's bounded clients), a job of the key parks and starts after the release; with one master
    stopped, the same still holds (a majority), and with two stopped, acquire raises rather than wait."""
    suite = dramatiq_unique.setup(broker, database=sqlite_url, redis=[s.url for s in servers], key_prefix=key_prefix,
                                  redriver=False)
    runs = Runs()

    @dramatiq.actor(unique_args=["customer_id"], unique_lock="while_executing")
    def sync(customer_id: int, n: int) -> None:
        runs.add(customer_id, n)

    worker = dramatiq.Worker(broker, worker_timeout=50, worker_threads=2)
    worker.start()
    try:
        held = dramatiq_unique.lock(sync, 42)
        assert held.masters == frozenset(node.client for node in suite.locks.nodes)
        assert held.acquire(blocking=False)
        plain = [redis.Redis.from_url(s.url) for s in servers]
        # pottery returns once a majority answered and leaves the last master's answer behind: the key
        # is on at least two of the three, each with the one token.
        tokens = [client.get(held.key) for client in plain]
        held_on = [token for token in tokens if token is not None]
        assert len(held_on) >= 2 and len(set(held_on)) == 1, f"one token on a majority: {tokens}"
        first = sync.send(42, 1)
        wait_until(lambda: parked(first), timeout=WAIT, what="the job parked")
        held.release()
        wait_until(lambda: finished(first), timeout=WAIT, what="the job after the release")
        # Its outcome is recorded before its lock is handed on: wait for the hand-over too.
        wait_until(lambda: not held.locked(), timeout=WAIT, what="the job's lock let go")

        servers[2].stop()
        assert held.acquire(blocking=False)
        second = sync.send(42, 2)
        wait_until(lambda: parked(second), timeout=WAIT, what="the job parked, one master down")
        assert 0 < held.locked() <= 60
        held.release()
        wait_until(lambda: finished(second), timeout=WAIT, what="the job after the release, one master down")

        servers[1].stop()
        with pytest.raises(pottery.QuorumIsImpossible):
            held.acquire(timeout=5)
        for client in plain:
            client.close()
    finally:
        worker.stop(timeout=10_000)
        suite.db.close()
    assert runs.args() == [(42, 1), (42, 2)]
