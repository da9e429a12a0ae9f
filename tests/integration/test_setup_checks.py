"""setup() fails fast and says what to do (dramatiq_unique.storage.database, dramatiq_unique.redis.servers).

A database or Redis that is down, or that takes the connection and never
answers, is a DependencyUnavailable naming the service and its address
(never a password) within the set-up timeouts; a database that cannot be
opened as given is an InvalidOption or DependencyUnavailable saying what
to write or install.
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Iterator

import dramatiq
import peewee as pw
import pytest
from dramatiq.brokers.redis import RedisBroker

import dramatiq_unique
from dramatiq_unique import DatabaseUnavailable, DependencyUnavailable, InvalidOption, JobModel, RedisUnavailable
from tests.conftest import REDIS_URL
from tests.durable import free_port, running_worker
from tests.helpers import job_of, under_faketime, wait_until
from tests.servers import PrivateRedis


class SilentServer:
    """Accepts TCP connections on a free port and never answers (a hung server)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.port = free_port()
        self.sock.bind(("127.0.0.1", self.port))
        self.sock.listen(16)
        self.accepted: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted.append(conn)

    def close(self) -> None:
        self.sock.close()
        for conn in self.accepted:
            conn.close()


@pytest.fixture
def silent() -> Iterator[SilentServer]:
    server = SilentServer()
    yield server
    server.close()


def test_a_database_that_never_answers_is_reported_within_the_connect_timeout(broker, silent, key_prefix):
    """Given a PostgreSQL URL whose server takes the connection and never answers, Then setup()
    raises DatabaseUnavailable naming the server (not the password), not hangs."""
    url = f"postgresql://app:s3cret@127.0.0.1:{silent.port}/jobs"
    began = time.monotonic()
    with pytest.raises(DatabaseUnavailable) as raised:
        dramatiq_unique.setup(broker, database=url, redis=REDIS_URL, key_prefix=key_prefix,
                              database_connect_timeout=2_000)
    assert time.monotonic() - began < 30, "bounded by the connect timeout"
    message = str(raised.value)
    assert f"postgresql://app@127.0.0.1:{silent.port}/jobs" in message and "s3cret" not in message
    assert silent.accepted, "it did connect, and waited for an answer"


def test_a_database_that_is_down_is_reported(broker, key_prefix):
    port = free_port()
    with pytest.raises(DatabaseUnavailable, match=f"127.0.0.1:{port}"):
        dramatiq_unique.setup(broker, database=f"postgresql://postgres@127.0.0.1:{port}/test", redis=REDIS_URL,
                              key_prefix=key_prefix)


def test_a_dead_redis_is_reported_with_its_address(broker, sqlite_url, key_prefix):
    port = free_port()
    with pytest.raises(RedisUnavailable) as raised:
        dramatiq_unique.setup(broker, database=sqlite_url, redis=f"redis://:pw0rd@127.0.0.1:{port}/3",
                              key_prefix=key_prefix)
    message = str(raised.value)
    assert "Redis" in message and f"redis://127.0.0.1:{port}/3" in message and "pw0rd" not in message
    assert isinstance(raised.value, DependencyUnavailable)


def test_a_redis_that_never_answers_is_reported_within_the_check_timeout(broker, sqlite_url, silent, key_prefix):
    """Whatever the client's own timeouts (none here), the check is bounded by check_timeout."""
    import redis

    client = redis.Redis(host="127.0.0.1", port=silent.port, socket_timeout=None)
    began = time.monotonic()
    with pytest.raises(RedisUnavailable, match=f"127.0.0.1:{silent.port}"):
        dramatiq_unique.setup(broker, database=sqlite_url, redis=client, key_prefix=key_prefix, check_timeout=300)
    assert time.monotonic() - began < 10


def test_the_brokers_own_redis_is_checked_too(sqlite_url, key_prefix):
    port = free_port()
    broker = RedisBroker(url=f"redis://127.0.0.1:{port}/0", namespace=key_prefix)
    with pytest.raises(RedisUnavailable, match=f"broker's\\) at redis://127.0.0.1:{port}/0"):
        dramatiq_unique.setup(broker, database=sqlite_url, redis=REDIS_URL, key_prefix=key_prefix)


def test_a_path_without_a_scheme_says_what_to_write(broker, key_prefix):
    with pytest.raises(InvalidOption, match="sqlite:///jobs.db"):
        dramatiq_unique.setup(broker, database="jobs.db", redis=REDIS_URL, key_prefix=key_prefix)


def test_a_sqlite_folder_that_does_not_exist_is_named(broker, tmp_path, key_prefix):
    folder = tmp_path / "nowhere"
    with pytest.raises(InvalidOption, match=f"folder {folder} does not exist"):
        dramatiq_unique.setup(broker, database=f"sqlite:///{folder}/jobs.db", redis=REDIS_URL, key_prefix=key_prefix)


def test_a_missing_postgres_driver_says_what_to_install(broker, monkeypatch, key_prefix):
    monkeypatch.setattr(pw, "psycopg2", None)
    monkeypatch.setattr(pw, "psycopg", None, raising=False)
    with pytest.raises(DependencyUnavailable, match=r"install dramatiq_unique\[postgres\]"):
        dramatiq_unique.setup(broker, database="postgresql://postgres@127.0.0.1/test", redis=REDIS_URL,
                              key_prefix=key_prefix)


def test_timeouts_are_settings_and_apply_to_a_postgres_url(broker, pg_url, key_prefix):
    suite = dramatiq_unique.setup(broker, database=pg_url, redis=REDIS_URL, key_prefix=key_prefix, redriver=False,
                                  database_connect_timeout=3_000, database_timeout=12_000)
    try:
        assert suite.db.connect_params["connect_timeout"] == 3
        assert suite.db.execute_sql("SHOW statement_timeout").fetchone() == ("12s",)
        assert suite.db.execute_sql("SHOW search_path").fetchone()[0].startswith("du_"), "the URL's options kept"
    finally:
        suite.close()
    with pytest.raises(InvalidOption, match="database_timeout"):
        dramatiq_unique.setup(broker, database=pg_url, redis=REDIS_URL, key_prefix=key_prefix, database_timeout=0)


def test_sqlite_opens_as_before(broker, sqlite_url, key_prefix):
    suite = dramatiq_unique.setup(broker, database=sqlite_url, redis=REDIS_URL, key_prefix=key_prefix, redriver=False)
    try:
        assert type(suite.db) is pw.SqliteDatabase
        assert suite.db.execute_sql("PRAGMA journal_mode").fetchone() == ("wal",)
        assert suite.db.execute_sql("PRAGMA busy_timeout").fetchone() == (30_000,)
    finally:
        suite.close()


def test_of_three_redlock_masters_a_majority_must_answer(broker, sqlite_url, key_prefix, caplog):
    dead = [f"redis://127.0.0.1:{free_port()}/0" for _ in range(2)]
    suite = dramatiq_unique.setup(broker, database=sqlite_url, redis=[REDIS_URL, REDIS_URL, dead[0]],
                                  key_prefix=key_prefix, redriver=False)
    suite.close()
    assert dead[0].split("//")[1] in caplog.text, "the master that is down is logged"
    with pytest.raises(RedisUnavailable, match=dead[0].split("//")[1]):
        dramatiq_unique.setup(broker, database=sqlite_url, redis=[REDIS_URL, *dead], key_prefix=key_prefix)


def test_the_redis_check_can_be_turned_off(broker, sqlite_url, key_prefix):
    suite = dramatiq_unique.setup(broker, database=sqlite_url, redis=f"redis://127.0.0.1:{free_port()}/0",
                                  key_prefix=key_prefix, redriver=False, check_redis=False)
    suite.close()


def test_a_redis_that_may_evict_keys_is_warned_of(broker, sqlite_url, key_prefix, caplog):
    """A memory limit with a policy other than noeviction lets Redis drop locks and queued messages when full:
    setup() warns, naming the policy and the fix; with noeviction, or no limit, it says nothing."""
    server = PrivateRedis(args=["--maxmemory", "64mb", "--maxmemory-policy", "volatile-lru"]).start()
    try:
        suite = dramatiq_unique.setup(broker, database=sqlite_url, redis=server.url, key_prefix=key_prefix,
                                      redriver=False)
        suite.close()
        assert "maxmemory-policy volatile-lru" in caplog.text and "set maxmemory-policy noeviction" in caplog.text
        caplog.clear()
        server.client().config_set("maxmemory-policy", "noeviction")
        dramatiq_unique.setup(broker, database=sqlite_url, redis=server.url, key_prefix=key_prefix,
                              redriver=False).close()
        assert "maxmemory" not in caplog.text
    finally:
        server.stop()


def test_a_redis_replica_is_refused_naming_its_master(broker, sqlite_url, key_prefix):
    """A URL that names a replica (a typo, or a manual fail-over that left the old master a replica): setup()
    refuses it, naming the master, instead of the first unique send failing with READONLY; among three
    Redlock masters it counts as one down."""
    master = PrivateRedis().start()
    replica = PrivateRedis(args=["--replicaof", "127.0.0.1", str(master.port)]).start()
    try:
        with pytest.raises(RedisUnavailable, match=f"is a replica of 127.0.0.1:{master.port}"):
            dramatiq_unique.setup(broker, database=sqlite_url, redis=replica.url, key_prefix=key_prefix,
                                  redriver=False)
        dramatiq_unique.setup(broker, database=sqlite_url, redis=[REDIS_URL, master.url, replica.url],
                              key_prefix=key_prefix, redriver=False).close()
    finally:
        replica.stop()
        master.stop()


def test_setup_again_on_one_broker_replaces_the_suite(broker, database_url, key_prefix):
    """setup() called a second time on one broker (an app factory, a test's fixture): the broker keeps one
    set of the suite's middlewares, the actors declared under the first suite are the second's, and each
    job of a tracked, a unique and a slot-limited actor runs once, recorded under the second suite's app
    (before: two sets of hooks, and most jobs never ran)."""
    first = dramatiq_unique.setup(broker, database=database_url, redis=REDIS_URL, key_prefix=key_prefix,
                                  redriver=False)
    runs: list[tuple[str, int]] = []
    lock = threading.Lock()

    def ran(label: str, n: int) -> None:
        with lock:
            runs.append((label, n))

    @dramatiq.actor(track=True, max_retries=0)
    def tracked(n):
        ran("tracked", n)

    @dramatiq.actor(unique_args=["n"], unique_lock="until_and_while_executing", max_retries=0)
    def unique(n):
        ran("unique", n)

    @dramatiq.actor(concurrency_limit=1, max_retries=0)
    def limited(n):
        ran("limited", n)

    second = dramatiq_unique.setup(broker, database=database_url, redis=REDIS_URL, key_prefix=f"{key_prefix}-2",
                                   redriver=False)
    try:
        kinds = [type(m).__name__ for m in broker.middleware]
        for kind in ("JobTracking", "ExecutionLocks", "ConcurrencySlots", "Redriver", "Metrics"):
            assert kinds.count(kind) == 1, kinds
        assert set(second.actors) >= {"tracked", "unique", "limited"}
        messages = [actor.send(n) for n in range(3) for actor in (tracked, unique, limited)]
        with running_worker(broker, threads=2):
            wait_until(lambda: all((job_of(m) or JobModel()).status == "succeeded" for m in messages), timeout=20,
                       what="every job to succeed")
        assert sorted(runs) == sorted((label, n) for n in range(3) for label in ("tracked", "unique", "limited"))
        assert {job_of(m).app for m in messages} == {second.app} != {first.app}
    finally:
        first.close()
        second.close()


SETUP_AND_CLOSE = """
import logging
from dramatiq.brokers.redis import RedisBroker
import dramatiq_unique
logging.basicConfig(level=logging.WARNING)
dramatiq_unique.setup(RedisBroker(url={redis!r}, namespace={ns!r}),
                      database={db!r}, redis={redis!r}, key_prefix={ns!r}, redriver=False).close()
"""


@pytest.mark.parametrize("offset, words", [("+3s", "3.0 s ahead of"), ("-3s", "3.0 s behind"), ("", None)])
def test_a_host_clock_off_the_databases_is_warned_of(pg_url, key_prefix, offset, words):
    """A job's lease is written with its host's clock and judged by others': setup() on a host whose clock is
    seconds off the database's warns, saying how far and what to do; in step, it says nothing."""
    done = under_faketime(offset, SETUP_AND_CLOSE.format(redis=REDIS_URL, ns=key_prefix, db=pg_url))
    assert done.returncode == 0, done.stderr
    if words is None:
        assert "clock" not in done.stderr
    else:
        assert f"this host's clock is {words} the database's" in done.stderr and "NTP" in done.stderr, done.stderr
