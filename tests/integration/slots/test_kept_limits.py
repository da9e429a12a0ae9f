"""Limits set at run time survive the loss of Redis data (dramatiq_unique.slots.overrides): each is kept
in the database and put back in Redis, on a Redis of the test's own that is killed and restarted
empty, and on the shared one with the test's own keys wiped; on SQLite and PostgreSQL."""

from __future__ import annotations

import threading
import time
from typing import Iterator

import dramatiq
import pytest
from dramatiq.brokers.redis import RedisBroker

import dramatiq_unique
from dramatiq_unique import concurrency_status, set_concurrency_limit
from dramatiq_unique.slots import overrides
from dramatiq_unique.slots.gate import gate_of
from dramatiq_unique.slots.limits import key_group
from tests.durable import RedisServer
from tests.helpers import wait_until
from tests.integration.slots.helpers import Recorder, rows


def _wipe(redis_client, key_prefix: str) -> int:
    """FLUSHDB, as far as this test's keys go (the shared Redis holds other tests' too)."""
    keys = list(redis_client.scan_iter(match=f"{key_prefix}*", count=1000))
    return redis_client.delete(*keys) if keys else 0


def test_a_halted_group_stays_halted_when_redis_is_wiped(suite, broker, make_worker, redis_client, key_prefix):
    """Given customer 42 halted (limit 0) and customer 7 at 1 (declared: 2), When Redis loses every key of
    the app, Then a new job of 42 parks instead of running at the declared limit, 7 runs one at a time,
    and both overrides are back in Redis; When 42 is resumed, its job runs."""
    rec = Recorder()

    @dramatiq.actor(concurrency_limit=2, concurrency_key=["customer"])
    def deliver(customer: int, i: int) -> None:
        rec.run(str(customer), i, 100)

    set_concurrency_limit("deliver", 0, key=42)
    set_concurrency_limit("deliver", 1, key=7)
    assert _wipe(redis_client, key_prefix) >= 2
    make_worker(4)
    halted = deliver.send(42, 0)
    for i in range(3):
        deliver.send(7, i)
    wait_until(lambda: rec.ended("7") == 3, timeout=15, what="customer 7's jobs to end")
    wait_until(lambda: dramatiq_unique.get_job(halted.message_id).parked_on, timeout=10, what="42's job parked")
    time.sleep(0.3)
    assert rec.started("42") == 0, "a halted group ran after Redis lost its data"
    assert rec.peak["7"] == 1
    assert redis_client.get(suite.keys.limit(key_group(suite.actor_config("deliver"), 42))) == b"0"
    assert concurrency_status("deliver", key=42).limit == 0

    assert set_concurrency_limit("deliver", None, key=42) == 1
    wait_until(lambda: rec.ended("42") == 1, timeout=10, what="42's job to run once resumed")


def test_the_redrive_keeps_a_halt_through_a_redis_flush(suite, broker, make_worker, redis_client, key_prefix):
    """Given jobs parked behind a halt, When Redis loses the app's keys (the parking flags and the
    halt with them), Then the re-drive's pass wakes nothing: it puts the halt back first."""
    rec = Recorder()

    @dramatiq.actor(concurrency_limit=2)
    def export(i: int) -> None:
        rec.run("g", i, 20)

    set_concurrency_limit("export", 0)
    make_worker(2)
    for i in range(3):
        export.send(i)
    wait_until(lambda: concurrency_status("export").parked == 3, timeout=10, what="3 parked jobs")
    _wipe(redis_client, key_prefix)
    counts = dramatiq_unique.redrive()
    assert counts.woken == 0 and rec.started() == 0
    assert redis_client.get(suite.keys.actor_limit("export")) == b"0"
    assert set_concurrency_limit("export", None) == 2
    wait_until(lambda: rec.ended() == 3, timeout=10, what="the jobs to run once resumed")


@pytest.fixture
def own_redis() -> Iterator[RedisServer]:
    server = RedisServer().start()
    yield server
    server.stop()


def test_a_halt_survives_a_restart_of_redis_that_lost_everything(own_redis, database_url, key_prefix):
    """On a Redis of the test's own (the broker's too): a group halted with jobs parked; Redis is killed
    and started again empty (no persistence), which loses the broker's messages, the parking flags and
    the halt.  The re-drive recovers the jobs; none runs while the halt is in the database; resumed, all run."""
    broker = RedisBroker(url=own_redis.url, namespace=key_prefix + "-own")
    dramatiq.set_broker(broker)
    suite = dramatiq_unique.setup(broker, database=database_url, redis=own_redis.url, key_prefix=key_prefix,
                                  redriver=False, lost_after=100)
    rec = Recorder()

    @dramatiq.actor(concurrency_limit=1, concurrency_key=["tenant"], max_retries=0)
    def sync(tenant: str, i: int) -> None:
        rec.run(tenant, i, 20)

    worker = dramatiq.Worker(broker, worker_timeout=50, worker_threads=2)
    try:
        set_concurrency_limit("sync", 0, key="acme")
        worker.start()
        for i in range(3):
            sync.send("acme", i)
        wait_until(lambda: concurrency_status("sync", key="acme").parked == 3, timeout=10, what="3 parked jobs")

        own_redis.stop()
        own_redis.start()  # the same port, empty
        for _ in range(3):  # enough passes to find the jobs' group with no holder and no flag
            dramatiq_unique.redrive()
            time.sleep(0.2)
        time.sleep(0.5)
        assert rec.started() == 0, "a halted group ran after Redis restarted empty"
        assert concurrency_status("sync", key="acme").limit == 0

        set_concurrency_limit("sync", None, key="acme")
        wait_until(lambda: rec.ended() == 3, timeout=15, what="the jobs to run once resumed")
        assert rec.peak["acme"] == 1
        wait_until(lambda: {r.status for r in rows("sync")} == {"succeeded"}, timeout=10, what="the outcomes")
    finally:
        worker.stop(timeout=10_000)
        broker.close()
        suite.close()


def test_the_redrive_puts_back_what_a_promoted_replica_lacks(suite, redis_client, key_prefix):
    """A replica promoted with the marker but without a later change (here: a key deleted, another
    rewritten): each re-drive pass compares and puts the database's values back."""

    @dramatiq.actor(concurrency_limit=2, concurrency_key=["customer"])
    def deliver(customer: int) -> None:
        pass

    set_concurrency_limit("deliver", 0, key=1)
    set_concurrency_limit("deliver", 5)
    group = key_group(suite.actor_config("deliver"), 1)
    assert redis_client.exists(suite.keys.limits_loaded())
    redis_client.delete(suite.keys.limit(group))
    redis_client.set(suite.keys.actor_limit("deliver"), 9)
    assert overrides.check(suite) == 2
    assert redis_client.get(suite.keys.limit(group)) == b"0"
    assert redis_client.get(suite.keys.actor_limit("deliver")) == b"5"
    assert overrides.check(suite) == 0  # all in place: nothing written


def test_limits_a_release_kept_only_in_redis_are_adopted(suite, redis_client, key_prefix):
    """An override in Redis with no row (written by a release that kept none), and no marker yet: the
    first slot decision adopts it into the table, so it survives the next wipe."""

    @dramatiq.actor(concurrency_limit=2, concurrency_key=["customer"])
    def deliver(customer: int) -> None:
        pass

    group = key_group(suite.actor_config("deliver"), 3)
    redis_client.delete(suite.keys.limits_loaded())
    redis_client.set(suite.keys.limit(group), 0)
    redis_client.set(suite.keys.actor_limit("deliver"), 4)
    assert gate_of(suite).status(f"slot:{group}").limit == 0
    kept = {(o.group, o.limit, o.words) for o in overrides.listing(suite, "deliver")}
    assert kept == {(group, 0, None), ("", 4, None)}
    _wipe(redis_client, key_prefix)
    assert gate_of(suite).status(f"slot:{group}").limit == 0


def test_a_slot_decision_reads_no_table_while_redis_has_the_limits(suite, redis_client, key_prefix, monkeypatch):
    """The hot path: enter, renew and leave send no statement to the database while the marker is in
    Redis; after a wipe, the first decision reads the table once, and the next ones none again."""

    @dramatiq.actor(concurrency_limit=2)
    def export() -> None:
        pass

    set_concurrency_limit("export", 1)
    statements: list[str] = []
    # On the instance: the suite's Database wraps its own execute_sql in place (savepoints, reconnects).
    execute = suite.db.execute_sql

    def counting(sql, *args, **kwargs):
        statements.append(sql)
        return execute(sql, *args, **kwargs)

    monkeypatch.setattr(suite.db, "execute_sql", counting)
    gate, group = gate_of(suite), "slot:export:all"
    for n in range(20):
        assert gate.enter(group, f"t{n}", 5_000, 2, None)[0]
        assert gate.renew(group, f"t{n}", 5_000, 2)
        gate.release(group, f"t{n}")
    assert statements == []
    _wipe(redis_client, key_prefix)
    assert gate.enter(group, "a", 5_000, 2, None)[0]
    assert not gate.enter(group, "b", 5_000, 2, None)[0], "the override (1) is back, not the declared 2"
    assert len([s for s in statements if "dramatiq_unique_limits" in s]) == 1
    statements.clear()
    gate.release(group, "a")
    assert gate.enter(group, "c", 5_000, 2, None)[0]
    assert statements == []


def test_a_change_and_a_restore_at_once_leave_redis_as_the_database(suite, redis_client, key_prefix):
    """Operators halting and resuming a group while Redis keeps losing the limits and threads put them
    back: at the end Redis holds what the database holds (a removed halt is never put back)."""

    @dramatiq.actor(concurrency_limit=2, concurrency_key=["customer"])
    def deliver(customer: int) -> None:
        pass

    group = key_group(suite.actor_config("deliver"), 5)
    stop = threading.Event()
    errors: list[BaseException] = []

    def restorer() -> None:
        try:
            while not stop.is_set():
                redis_client.delete(suite.keys.limits_loaded(), suite.keys.limit(group))
                overrides.restore_if_lost(suite)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)
        finally:
            suite.close()  # this thread's connection

    threads = [threading.Thread(target=restorer) for _ in range(2)]
    for thread in threads:
        thread.start()
    try:
        for n in range(40):  # the record of set_concurrency_limit (which then wakes, as no restore does)
            overrides.write(suite, "deliver", group, 0 if n % 2 == 0 else None, words="customer=5", key=5)
    finally:
        stop.set()
        for thread in threads:
            thread.join(30)
    assert not errors, errors
    overrides.restore_if_lost(suite)
    assert overrides.find(suite, "deliver", group) is None
    assert redis_client.get(suite.keys.limit(group)) is None
