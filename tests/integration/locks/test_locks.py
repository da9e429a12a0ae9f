"""Locks over three Redis masters (dramatiq_unique.locks: Redlock), with masters stopped or stalled.

Each test starts its own three ``redis-server`` processes on free loopback
ports in 6401-6409 (nothing persisted) and stops them afterwards; the
shared Redis only carries the broker.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import time
from typing import Iterator

import dramatiq
import pytest
import redis

import dramatiq_unique
from dramatiq_unique import RedisUnavailable, current_job, heartbeat
from dramatiq_unique.locks import redlock
from dramatiq_unique.locks.redlock import KEPT, NOT_HELD, RELEASED, Locks, new_token
from tests.helpers import wait_until

PORTS = range(6401, 6410)


class RedisServer:
    """A throw-away redis-server on a free port of PORTS."""

    def __init__(self, taken: set[int]) -> None:
        for port in PORTS:
            if port in taken or not _free(port):
                continue
            process = subprocess.Popen(
                ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                 "--daemonize", "no"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )
            client = redis.Redis(port=port, socket_timeout=1)
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline and process.poll() is None:
                try:
                    client.ping()
                    self.port, self.process, self.url = port, process, f"redis://127.0.0.1:{port}/0"
                    client.close()
                    return
                except redis.ConnectionError:
                    time.sleep(0.02)
            process.kill()
            process.wait(5)
        raise RuntimeError("no free port for a redis-server in 6401-6409")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)


def _free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as redis-server binds
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


@pytest.fixture
def masters() -> Iterator[list[RedisServer]]:
    servers: list[RedisServer] = []
    try:
        for _ in range(3):
            servers.append(RedisServer({s.port for s in servers}))
        yield servers
    finally:
        for server in servers:
            server.stop()


def clients(servers) -> list[redis.Redis]:
    # Short timeouts: a stopped master must fail fast, not hang the lock.
    return [redis.Redis.from_url(s.url, socket_timeout=0.5, socket_connect_timeout=0.5) for s in servers]


def test_three_masters_lock_like_one(masters):
    locks = Locks(clients(masters))
    token, _ = locks.acquire("job", 2_000)
    assert token is not None and locks.acquire("job", 2_000) == (None, token), "a majority names the holder"
    assert all(locks.extend("job", token, 2_000) for _ in range(20)), "no limit on extensions"
    assert 1_500 < locks.ttl("job", token) <= 2_000 and 1_500 < locks.pttl("job") <= 2_000
    fresh = new_token()
    assert locks.transfer("job", token, fresh, 2_000)
    assert not locks.extend("job", token, 2_000) and locks.extend("job", fresh, 2_000)
    flags = clients(masters)[0]
    flags.zadd("flags", {"lock:job": 1})
    assert locks.release_unless("job", fresh, "flags", "lock:job") == KEPT
    flags.zrem("flags", "lock:job")
    assert locks.release_unless("job", fresh, "flags", "lock:job") == RELEASED
    assert locks.release_unless("job", fresh, "flags", "lock:job") == NOT_HELD
    assert locks.pttl("job") == 0 and locks.acquire("job", 1_000)[0] is not None


@pytest.mark.slow
def test_pottery_redlocks_and_ours_exclude_each_other(masters):
    """Given the same three masters, When a pottery Redlock holds a name, Then our lock of that
    name is refused, and the other way round: the same keys (``redlock:<name>``), the same rules.
    (The suite no longer calls pottery; an application's own pottery locks still count.)"""
    import json

    dumps = json.dumps
    import pottery  # it replaces json.dumps on import: put the original back for the rest of the run

    json.dumps = dumps
    theirs = pottery.Redlock(key="shared", masters=set(clients(masters)), auto_release_time=2)
    locks = Locks(clients(masters))
    assert theirs.acquire(blocking=False)
    assert locks.acquire("shared", 2_000)[0] is None
    theirs.release()
    token, _ = locks.acquire("shared", 2_000)
    assert token is not None
    assert not pottery.Redlock(key="shared", masters=set(clients(masters)), auto_release_time=2).acquire(
        blocking=False)
    assert locks.release("shared", token)


def test_locks_work_with_one_master_of_three_stopped_and_refuse_with_two(masters):
    locks = Locks(clients(masters))
    masters[1].stop()
    token, _ = locks.acquire("job", 2_000)
    assert token is not None and locks.acquire("job", 2_000)[0] is None
    assert locks.extend("job", token, 2_000) and locks.transfer("job", token, "next", 2_000)
    assert locks.release("job", "next") and locks.pttl("job") == 0
    masters[2].stop()
    for attempt in (lambda: locks.acquire("job", 2_000), lambda: locks.extend("job", "next", 2_000),
                    lambda: locks.transfer("job", "next", "other", 2_000), lambda: locks.pttl("job")):
        with pytest.raises(RedisUnavailable):
            attempt()


def lock_suite(broker, database_url, key_prefix, masters):
    return dramatiq_unique.setup(broker, database=database_url, redis=clients(masters), key_prefix=key_prefix,
                                 redriver=False)


@pytest.mark.slow
@pytest.mark.parametrize("stopped", [0, 2])
def test_jobs_keep_their_execution_locks_with_a_master_stopped(broker, database_url, key_prefix, masters, stopped):
    """Given three masters of which one is stopped (the first one holds the
    wake-up flags), then jobs of one key still run one at a time, heartbeat
    renews their lock, and each waiting job is woken."""
    suite = lock_suite(broker, database_url, key_prefix, masters)
    spans = []
    lock = threading.Lock()

    @dramatiq.actor(unique_args=["key"], unique_lock="while_executing", unique_ttl=3_000)
    def step(key, i):
        start = time.monotonic()
        time.sleep(0.05)
        left = heartbeat()
        with lock:
            spans.append((start, time.monotonic(), i, current_job().fencing_token, left))

    masters[stopped].stop()
    worker = dramatiq.Worker(broker, worker_timeout=50, worker_threads=4)
    worker.start()
    try:
        for i in range(5):
            step.send("k", i)
        wait_until(lambda: len(spans) == 5, timeout=30, what="five jobs")
    finally:
        worker.stop(timeout=10_000)
        suite.db.close()
    spans.sort()
    for (_, e1, *_), (s2, *_) in zip(spans, spans[1:], strict=False):
        assert s2 >= e1
    assert [t for *_, t, _ in spans] == sorted(t for *_, t, _ in spans)
    assert all(2.0 < left <= 3.0 for *_, left in spans)


@pytest.mark.slow
def test_with_two_masters_of_three_stopped_no_job_runs_unlocked(broker, database_url, key_prefix, masters):
    suite = lock_suite(broker, database_url, key_prefix, masters)
    ran = []

    @dramatiq.actor(unique_args=["key"], unique_lock="while_executing", min_backoff=60_000, max_backoff=60_000)
    def guarded(key):
        ran.append(key)

    masters[1].stop()
    masters[2].stop()
    worker = dramatiq.Worker(broker, worker_timeout=50, worker_threads=2)
    worker.start()
    try:
        message = guarded.send("k")
        delayed = f"{broker.namespace}:default.DQ.msgs"
        wait_until(lambda: broker.client.hlen(delayed) == 1, timeout=15, what="the retry in the delay queue")
    finally:
        worker.stop(timeout=10_000)
        suite.db.close()
    assert ran == []
    assert dramatiq_unique.get_job(message.message_id).status not in ("running", "succeeded")
    retry = dramatiq.Message.decode(next(iter(broker.client.hvals(delayed))))
    assert "RedisUnavailable" in retry.options["traceback"]


def test_with_three_masters_the_queue_lock_carries_the_message_id_and_is_freed_at_start(broker, sqlite_url,
                                                                                      key_prefix, masters):
    """Given three masters, When a unique job is sent, Then its queue lock on each master holds the
    message id (as with one master, so the worker that starts it can free it), and is gone once it ran."""
    suite = lock_suite(broker, sqlite_url, key_prefix, masters)
    ran = []

    @dramatiq.actor(unique_args=["key"], unique_lock="until_executing")
    def once(key):
        ran.append(key)

    message = once.send("k")
    job = dramatiq_unique.get_job(message.message_id)
    lock_key = f"redlock:{suite.keys.queue_lock(job.unique_key)}"
    assert [c.get(lock_key) for c in clients(masters)] == [message.message_id.encode()] * 3
    worker = dramatiq.Worker(broker, worker_timeout=50, worker_threads=1)
    worker.start()
    try:
        wait_until(lambda: ran == ["k"], timeout=10, what="the job")
        wait_until(lambda: not any(c.exists(lock_key) for c in clients(masters)), timeout=10,
                   what="the queue lock freed")
    finally:
        worker.stop(timeout=10_000)
        suite.db.close()


def test_a_dead_or_stalled_master_is_asked_over_a_bounded_client_and_then_skipped(masters):
    """Given clients with redis-py's own defaults (5 s timeouts, retries with back-off), When one master
    of three is stalled (SIGSTOP), Then locks still work, the stalled master is asked with lock_timeout
    and no retry after a timeout, and is skipped for a while after it failed, whatever client was given."""
    given = [redis.Redis(host="127.0.0.1", port=s.port) for s in masters]
    locks = Locks(given, timeout_ms=50)
    for node, client in zip(locks.nodes, given, strict=True):
        kwargs = node.client.connection_pool.connection_kwargs
        assert (kwargs["socket_timeout"], kwargs["socket_connect_timeout"]) == (0.05, 0.05)
        retry = kwargs["retry"]  # once after a broken connection, never after a timeout
        assert retry.get_retries() == 1 and retry._supported_errors == (redis.ConnectionError,)
        assert kwargs["port"] == client.connection_pool.connection_kwargs["port"]
    token, _ = locks.acquire("job", 5_000)
    os.kill(masters[1].process.pid, signal.SIGSTOP)
    try:
        assert locks.extend("job", token, 5_000)
        assert locks.nodes[1].down_until > time.monotonic(), "the stalled master failed, and is skipped"
        assert locks.nodes[1].skipped()
        replies = redlock.ask_all(locks.nodes, lambda master: master.client.ping(), locks.quorum)
        assert replies.replies == [True, True] and isinstance(replies.errors[0], redlock.MasterSkipped)
        fresh = new_token()
        assert locks.transfer("job", token, fresh, 5_000) and locks.release("job", fresh)
        assert locks.acquire("job", 5_000)[0] is not None
    finally:
        os.kill(masters[1].process.pid, signal.SIGCONT)


def test_a_lock_held_by_a_minority_is_freed_there_when_its_holder_finds_it_lost(masters):
    """Given a holder whose lock survives on one master of three only (the others lost it: expired,
    restarted), When it hands the lock on or releases it with a waiter flagged, Then the hand-over
    fails and the minority's copy is freed at once, not left in the next holder's way until it expires."""
    given = clients(masters)
    locks = Locks(given)
    token, _ = locks.acquire("job", 30_000)
    for client in given[1:]:
        client.delete("redlock:job")
    assert not locks.transfer("job", token, new_token(), 30_000)
    assert given[0].get("redlock:job") is None
    assert locks.acquire("job", 30_000)[0] is not None
    token, _ = locks.acquire("other", 30_000)
    for client in given[1:]:
        client.delete("redlock:other")
    given[0].zadd("flags", {"lock:other": 1})
    assert locks.release_unless("other", token, "flags", "lock:other") == NOT_HELD
    assert given[0].get("redlock:other") is None


def test_lock_timeout_bounds_the_masters_and_the_first_masters_plain_state(broker, sqlite_url, key_prefix, masters):
    """Given three masters and lock_timeout=250, Then each master and the suite's plain Redis state (the
    first master: slots, wake-up flags) go over bounded clients; with one server, the client given is used."""
    suite = dramatiq_unique.setup(broker, database=sqlite_url, key_prefix=key_prefix, redriver=False,
                                  redis=[s.url for s in masters], lock_timeout=250)
    try:
        assert suite.redis is suite.locks.nodes[0].client
        for node in suite.locks.nodes:
            assert node.client.connection_pool.connection_kwargs["socket_timeout"] == 0.25
        assert suite.redis.ping()
    finally:
        suite.db.close()
    for bad in (0, -1, "100"):
        with pytest.raises(dramatiq_unique.InvalidOption, match="lock_timeout"):
            dramatiq_unique.setup(broker, database=sqlite_url, key_prefix=key_prefix, redriver=False,
                                  redis=[s.url for s in masters], lock_timeout=bad)
    given = redis.Redis.from_url(masters[0].url)
    one = dramatiq_unique.setup(broker, database=sqlite_url, key_prefix=key_prefix, redriver=False, redis=given)
    try:
        assert one.redis is given and one.locks.single
    finally:
        one.db.close()
