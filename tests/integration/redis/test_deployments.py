"""The suite and Dramatiq's RedisBroker on Redis servers set up as in production, each a server of
the test's own: TLS only (``rediss://``: the server's CA, client certificates, no socket timeout),
``requirepass``, and an ACL user, each named in the URL.

On each, the same work: unique sends (a duplicate resolves to the waiting job), a ``send_many``
batch (one MULTI/EXEC), and a worker running jobs under execution locks, and ``until_executing``
ones, whose start frees the queue lock with a posted call, while more sends arrive.  Asserted: every job ran once and
succeeded, and no key ran beside itself.
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import Iterator, Union

import dramatiq
import pytest
import redis
from dramatiq.brokers.redis import RedisBroker

import dramatiq_unique
from dramatiq_unique import JobModel, RedisUnavailable, send_many
from tests.durable import running_worker
from tests.helpers import job_of, wait_until
from tests.servers import PrivateRedis


class Runs:
    """Which keys are running now; a key that starts while running is a job beside itself."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.running: set[str] = set()
        self.total = 0
        self.beside: list[str] = []

    def enter(self, key: str) -> None:
        with self.lock:
            if key in self.running:
                self.beside.append(key)
            self.running.add(key)
            self.total += 1

    def leave(self, key: str) -> None:
        with self.lock:
            self.running.discard(key)


def exercise(broker_client: redis.Redis, suite_redis: Union[str, redis.Redis], sqlite_url: str) -> None:
    """The work of every shape (see the module's docs)."""
    prefix = f"dudeploy_{uuid.uuid4().hex[:8]}"
    broker = RedisBroker(client=broker_client, namespace=f"{prefix}-broker")
    dramatiq.set_broker(broker)
    suite = dramatiq_unique.setup(broker, database=sqlite_url, redis=suite_redis, key_prefix=prefix, redriver=False)
    runs = Runs()
    try:
        @dramatiq.actor(actor_name="deployed", unique_args=["key"], unique_lock="until_and_while_executing",
                        unique_ttl=30_000, max_retries=3, min_backoff=50, max_backoff=200)
        def deployed(key: str, n: int) -> None:
            runs.enter(key)
            time.sleep(0.01)
            runs.leave(key)

        @dramatiq.actor(actor_name="queued_once", unique_args=["key"], unique_lock="until_executing",
                        max_retries=3, min_backoff=50, max_backoff=200)
        def queued_once(key: str, n: int) -> None:
            runs.enter(f"queued-{key}-{n}")
            runs.leave(f"queued-{key}-{n}")

        first = deployed.send("a", 0)
        assert job_of(deployed.send("a", 1)).id == job_of(first).id, "a duplicate resolves to the waiting job"
        batch = send_many(deployed, [(f"k{i % 5}", i) for i in range(20)])
        assert len({job_of(m).id for m in batch}) == 5, "one job per key of the batch"
        send_many(queued_once, [(f"b{i}", i) for i in range(12)])  # run one after another by each thread
        with running_worker(broker, threads=4):
            for i in range(40):  # while jobs start and end: some of these wait, some are duplicates
                deployed.send(f"w{i % 4}", i)
                queued_once.send(f"q{i % 4}", i)
                time.sleep(0.005)
            wait_until(lambda: all(str(r.status) == "succeeded" for r in JobModel.select()), timeout=60,
                       what="every job to succeed")
        rows = list(JobModel.select())
        assert len(rows) >= 6 + 12 + 4 + 4 and {str(r.status) for r in rows} == {"succeeded"}
        assert runs.total == len(rows), "every job ran once"
        assert not runs.beside, f"keys that ran beside themselves: {runs.beside}"
    finally:
        suite.db.close()
        broker.close()


@pytest.fixture
def tls_server(request, certs) -> Iterator[PrivateRedis]:
    server = PrivateRedis(tls=certs, client_certs=request.param == "client-certs").start()
    yield server
    server.stop()


@pytest.mark.parametrize("tls_server", ["ca", "client-certs"], indirect=True)
def test_the_suite_and_the_broker_over_tls(tls_server, sqlite_url):
    """Given a Redis that speaks TLS only, When the suite and the broker are given ``rediss://`` URLs
    with the CA's certificate (and the client's), Then unique sends, batches and a worker all work."""
    exercise(redis.Redis.from_url(tls_server.url), tls_server.url, sqlite_url)


@pytest.mark.parametrize("tls_server", ["client-certs"], indirect=True)
def test_the_suite_and_the_broker_over_tls_without_a_socket_timeout(tls_server, sqlite_url):
    """Given clients without a socket timeout (TLS sockets then refuse non-blocking reads by flag),
    Then the work is the same."""
    # The suite on another database: a job's start then frees its queue lock by a posted call of
    # its own (not with the broker's ack), and a thread posts again at its next job's start.
    exercise(redis.Redis.from_url(tls_server.url, socket_timeout=None),
             redis.Redis.from_url(tls_server.url.replace("/0?", "/1?"), socket_timeout=None), sqlite_url)


@pytest.mark.parametrize("tls_server", ["client-certs"], indirect=True)
def test_a_client_without_its_certificate_is_refused_at_setup(tls_server, sqlite_url, broker):
    url = tls_server.url.split("&")[0]  # the CA alone
    with pytest.raises(RedisUnavailable, match="rediss://127.0.0.1"):
        dramatiq_unique.setup(broker, database=sqlite_url, redis=url, redriver=False)


@pytest.fixture
def guarded_server() -> Iterator[PrivateRedis]:
    """A Redis with a password for its default user and an ACL user ``app``."""
    server = PrivateRedis(password="admin secret").start()
    admin = server.client()
    # The app's own user: every key and channel, every command but the dangerous ones (CONFIG,
    # DEBUG, FLUSHALL, KEYS...), as a managed Redis gives.
    admin.acl_setuser("app", enabled=True, passwords=["+app:pass@word"], keys=["*"], channels=["*"],
                      commands=["+@all", "-@dangerous"])
    admin.close()
    yield server
    server.stop()


@pytest.mark.parametrize("who", ["default user (requirepass)", "ACL user"])
def test_the_suite_and_the_broker_with_credentials_in_the_url(guarded_server, who, sqlite_url):
    url = guarded_server.url if who.startswith("default") else guarded_server.url_as("app", "app:pass@word")
    exercise(redis.Redis.from_url(url), url, sqlite_url)


def test_wrong_credentials_are_refused_at_setup(guarded_server, sqlite_url, broker):
    with pytest.raises(RedisUnavailable, match="redis://127.0.0.1"):
        dramatiq_unique.setup(broker, database=sqlite_url, redis=guarded_server.url_as("app", "wrong"),
                              redriver=False)
