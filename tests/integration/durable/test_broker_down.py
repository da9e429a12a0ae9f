"""Sending while the broker is down (dramatiq_unique.durable.deferral, setting ``on_broker_down``).

The Redis broker runs on a redis-server of the test's own (tests/durable.py), which the test
stops and starts again, empty, on the same port; the suite's locks are on the shared Redis under
the test's key prefix, or on that same private server.  RabbitMQ is the shared server behind a
proxy of the test's own (tests/proxy.py) that goes down and up: the shared server is never
stopped.  The job table is SQLite or PostgreSQL (the fixtures' isolated file or schema).
"""

from __future__ import annotations

import collections
import logging
import threading
import uuid
from typing import Any, Iterator
from urllib.parse import urlparse

import dramatiq
import pytest
import redis
from dramatiq.brokers.rabbitmq import RabbitmqBroker
from dramatiq.brokers.redis import RedisBroker
from dramatiq.common import dq_name, xq_name

import dramatiq_unique
from dramatiq_unique import JobModel
from dramatiq_unique.durable import deferral
from tests.conftest import RABBITMQ_URL, REDIS_URL
from tests.durable import RedisServer, running_worker
from tests.helpers import job_of, wait_until
from tests.proxy import Proxy

SUCCEEDED = "succeeded"


class Runs:
    """How many times each job ran, counted by the actors (worker threads of this process)."""

    def __init__(self) -> None:
        self.counts: collections.Counter = collections.Counter()
        self._lock = threading.Lock()

    def add(self, key: Any) -> None:
        with self._lock:
            self.counts[key] += 1


@pytest.fixture
def private() -> Iterator[RedisServer]:
    """The broker's redis-server, the test's own."""
    server = RedisServer().start()
    yield server
    server.stop()


def redis_rig(server: RedisServer, database_url: str, key_prefix: str, *, locks: str = "shared", **settings: Any):
    broker = RedisBroker(url=server.url, namespace=f"{key_prefix}-down")
    dramatiq.set_broker(broker)
    suite = dramatiq_unique.setup(broker, database=database_url, redis=REDIS_URL if locks == "shared" else server.url,
                                  key_prefix=key_prefix, redriver=False, **settings)
    return broker, suite


def declare(runs: Runs, **tracked_options: Any) -> tuple[dramatiq.Actor, dramatiq.Actor]:
    @dramatiq.actor(track=True, max_retries=0, **tracked_options)
    def tracked(i):
        runs.add(("tracked", i))

    @dramatiq.actor(unique_args=["key"], max_retries=0, **tracked_options)
    def unique(key):
        runs.add(("unique", key))

    return tracked, unique


def send_through_an_outage(tracked, unique, jobs: int, uniques: int, duplicates: int) -> list:
    """Sends ``jobs`` jobs (the last ``uniques`` of them unique) and ``duplicates`` duplicates while
    the broker is down; returns the jobs' messages."""
    messages = [tracked.send(i) for i in range(jobs - uniques)] + [unique.send(key=k) for k in range(uniques)]
    again = [unique.send(key=k) for k in range(duplicates)]
    assert [m.message_id for m in again] == [m.message_id for m in messages[jobs - uniques:][:duplicates]], \
        "a duplicate resolves to the job that holds its key"
    rows = list(JobModel.select())
    assert len(rows) == jobs and {r.status for r in rows} == {"pending"}
    assert {r.message_id for r in rows} == {m.message_id for m in messages}, "each message's id is its job's"
    assert all(r.enqueued_at is None and r.broker_ref is None for r in rows)
    return messages


def run_all(broker, runs: Runs, messages: list, *, expected: int) -> None:
    """Re-drive, run a worker until every job succeeded, and check each ran once."""
    counts = dramatiq_unique.redrive()
    assert counts.sent == expected and counts.deferred == expected and counts.errors == 0, counts
    with running_worker(broker, threads=4):
        wait_until(lambda: JobModel.select().where(JobModel.status == SUCCEEDED).count() == expected, timeout=30,
                   what="every job to succeed")
    assert JobModel.select().count() == expected
    assert len(runs.counts) == expected and set(runs.counts.values()) == {1}, runs.counts


def test_tracked_sends_while_the_redis_broker_is_down_run_once_it_is_back(private, database_url, key_prefix):
    """Given the broker's redis-server stopped, When 100 tracked jobs (20 unique) and 10 duplicates
    are sent, Then every send returns, the 100 rows wait pending, and once the server is back
    (empty) the re-drive publishes them and exactly the 100 run, each once."""
    broker, suite = redis_rig(private, database_url, key_prefix)
    runs = Runs()
    tracked, unique = declare(runs)
    try:
        private.stop()
        messages = send_through_an_outage(tracked, unique, 100, 20, 10)
        private.start()
        run_all(broker, runs, messages, expected=100)
    finally:
        broker.close()
        suite.db.close()


def test_with_the_locks_on_the_brokers_server_too(private, sqlite_url, key_prefix):
    """The usual set-up: one Redis for the broker and the locks.  A unique send's queue lock goes
    with its publish (broker/publish.py), so neither is written; the unique index decides."""
    broker, suite = redis_rig(private, sqlite_url, key_prefix, locks="broker")
    runs = Runs()
    tracked, unique = declare(runs)
    try:
        private.stop()
        messages = send_through_an_outage(tracked, unique, 30, 10, 10)
        private.start()
        run_all(broker, runs, messages, expected=30)
    finally:
        broker.close()
        suite.db.close()


def test_without_the_short_circuit_every_send_tries_the_broker_and_is_kept(private, sqlite_url, key_prefix,
                                                                           monkeypatch):
    """Every send tries the broker (no backoff): the failed publish's row is made pending."""
    broker, suite = redis_rig(private, sqlite_url, key_prefix, broker_down_backoff=0.001)
    runs = Runs()
    tracked, unique = declare(runs)
    tried = []
    publish = broker.do_enqueue  # the suite's publisher (broker/publish.py)
    monkeypatch.setattr(broker, "do_enqueue", lambda *a: (tried.append(1), publish(*a))[1])
    try:
        private.stop()
        messages = send_through_an_outage(tracked, unique, 10, 5, 3)
        assert len(tried) == 10, "each new job tried the broker; a duplicate never gets that far"
        private.start()
        run_all(broker, runs, messages, expected=10)
    finally:
        broker.close()
        suite.db.close()


def test_raise_keeps_plain_dramatiqs_behaviour(private, sqlite_url, key_prefix):
    broker, suite = redis_rig(private, sqlite_url, key_prefix, on_broker_down="raise")
    tracked, unique = declare(Runs())
    try:
        private.stop()
        for send in (lambda: tracked.send(1), lambda: unique.send(key=1)):
            with pytest.raises(redis.ConnectionError):
                send()
        assert JobModel.select().count() == 0, "no row is left"
        assert list(suite.redis.scan_iter(match=f"redlock:{key_prefix}:*")) == [], "nor a queue lock"
    finally:
        broker.close()
        suite.db.close()


def test_an_untracked_send_raises_as_in_dramatiq(private, sqlite_url, key_prefix):
    broker, suite = redis_rig(private, sqlite_url, key_prefix)

    @dramatiq.actor
    def plain():
        pass

    try:
        private.stop()
        with pytest.raises(redis.ConnectionError):
            plain.send()
        tracked, _ = declare(Runs())
        tracked.send(1)  # deferred: the outage is on; still an untracked send raises
        with pytest.raises(redis.ConnectionError):
            plain.send()
    finally:
        broker.close()
        suite.db.close()


def test_one_warning_per_outage_and_one_info_line_when_the_backlog_is_published(private, sqlite_url, key_prefix,
                                                                               caplog):
    broker, suite = redis_rig(private, sqlite_url, key_prefix)
    tracked, _ = declare(Runs())
    caplog.set_level(logging.DEBUG, logger=deferral.__name__)

    def lines(level: int) -> list[str]:
        return [r.getMessage() for r in caplog.records if r.name == deferral.__name__ and r.levelno == level]

    try:
        private.stop()
        for i in range(5):
            tracked.send(i)
        assert dramatiq_unique.redrive().errors == 1, "the re-drive's failure is part of the same outage"
        (warning,) = lines(logging.WARNING)
        assert "RedisBroker at 127.0.0.1:" in warning and "kept pending" in warning
        private.start()
        assert dramatiq_unique.redrive().deferred == 5
        assert lines(logging.INFO) == ["Published 5 jobs deferred while the broker was down."]
        tracked.send(5)  # published: the outage is over
        private.stop()
        tracked.send(6)
        assert len(lines(logging.WARNING)) == 2, "a second outage, a second warning"
        private.start()
        assert dramatiq_unique.redrive().deferred == 1
        assert lines(logging.INFO)[-1] == "Published 1 job deferred while the broker was down."
    finally:
        broker.close()
        suite.db.close()


def test_a_replacing_duplicate_during_an_outage_waits_pending_with_its_new_arguments(private, sqlite_url, key_prefix):
    """A job queued before the outage, replaced by a duplicate during it: the replaced job is sent
    by the re-drive once, with the new arguments; its first message is skipped as superseded."""
    broker, suite = redis_rig(private, sqlite_url, key_prefix)
    seen = []

    @dramatiq.actor(unique_args=["key"], unique_on_conflict="replace", max_retries=0)
    def report(key, version):
        seen.append(version)

    try:
        first = report.send(key=1, version="old")
        private.stop()
        second = report.send(key=1, version="new")
        assert second.message_id == first.message_id
        job = job_of(first)
        assert job.status == "pending" and job.kwargs["version"] == "new"
        private.start()  # empty: the first message is gone anyway
        assert dramatiq_unique.redrive().sent == 1
        with running_worker(broker):
            wait_until(lambda: job_of(first).status == SUCCEEDED, timeout=10)
        assert seen == ["new"]
    finally:
        broker.close()
        suite.db.close()


def test_a_raising_duplicate_and_submit_during_an_outage(private, sqlite_url, key_prefix):
    broker, suite = redis_rig(private, sqlite_url, key_prefix)

    @dramatiq.actor(unique_args=["key"], unique_on_conflict="raise")
    def charge(key):
        pass

    try:
        private.stop()
        first = charge.send(key=1)
        with pytest.raises(dramatiq_unique.DuplicateJob) as raised:
            charge.send(key=1)
        assert raised.value.job.message_id == first.message_id and raised.value.job.status == "pending"
        job, created = dramatiq_unique.submit(charge, key=2, idempotency_key="order-2")
        assert created and job.status == "pending"
        assert dramatiq_unique.submit(charge, key=2, idempotency_key="order-2") == (job, False)
    finally:
        broker.close()
        suite.db.close()


def test_a_retry_whose_publish_fails_in_an_outage_is_sent_by_the_redrive(private, sqlite_url, key_prefix,
                                                                         monkeypatch, caplog):
    """Retries' re-enqueue fails (the broker's publish refuses while the job runs; the worker's own
    connection stays up, or Dramatiq's consumer would wait 5 s to ack): the job waits ``retrying``
    for the re-drive, which sends it when it is due; it then succeeds."""
    broker, suite = redis_rig(private, sqlite_url, key_prefix)
    attempts = []
    publish = broker.do_enqueue  # the suite's publisher (broker/publish.py)

    def refused(*args):
        raise redis.ConnectionError("Error 111 connecting: Connection refused.")

    @dramatiq.actor(track=True, max_retries=3, min_backoff=10, max_backoff=10)
    def flaky():
        attempts.append(1)
        if len(attempts) == 1:
            monkeypatch.setattr(broker, "do_enqueue", refused)
            raise ValueError("first attempt fails, and the broker is gone")

    try:
        message = flaky.send()
        with running_worker(broker):
            wait_until(lambda: job_of(message).status == "retrying" and job_of(message).enqueued_at is None,
                       timeout=10, what="the retry to wait for the re-drive")
            monkeypatch.setattr(broker, "do_enqueue", publish)
            wait_until(lambda: dramatiq_unique.redrive().sent == 1, timeout=10)
            wait_until(lambda: job_of(message).status == SUCCEEDED, timeout=15)
        assert len(attempts) == 2 and job_of(message).attempts == 2
        assert not [r for r in caplog.records if r.levelno >= logging.CRITICAL], "kept: no hook failure logged"
    finally:
        broker.close()
        suite.db.close()


# -- RabbitMQ ----------------------------------------------------------------------------------------


@pytest.fixture
def rabbit_proxy() -> Iterator[Proxy]:
    proxy = Proxy(urlparse(RABBITMQ_URL).port or 5672)
    yield proxy
    proxy.close()


def test_tracked_sends_while_rabbitmq_is_down_run_once_it_is_back(rabbit_proxy, database_url, key_prefix):
    """RabbitMQ behind a proxy that goes down: 20 tracked jobs (5 unique) and 5 duplicates sent
    meanwhile, half of them to a queue this process had not declared yet (Dramatiq's broker
    declares it before it records the send); back up, exactly the 20 run, each once."""
    warm, cold = f"du_{uuid.uuid4().hex[:10]}", f"du_{uuid.uuid4().hex[:10]}"
    url = urlparse(RABBITMQ_URL)
    netloc = f"{url.username}:{url.password}@127.0.0.1:{rabbit_proxy.port}"
    broker = RabbitmqBroker(url=url._replace(netloc=netloc).geturl())
    dramatiq.set_broker(broker)
    suite = dramatiq_unique.setup(broker, database=database_url, redis=REDIS_URL, key_prefix=key_prefix,
                                  redriver=False)
    runs = Runs()
    tracked, unique = declare(runs, queue_name=warm)

    @dramatiq.actor(track=True, queue_name=cold)
    def late(i):
        runs.add(("late", i))

    try:
        broker.declare_queue(warm, ensure=True)  # this process declared the warm queue before the outage
        rabbit_proxy.down()
        messages = send_through_an_outage(tracked, unique, 11, 5, 5)
        messages += [late.send(i) for i in range(10)]
        assert {job_of(m).status for m in messages} == {"pending"}
        rabbit_proxy.up()
        run_all(broker, runs, messages, expected=21)
    finally:
        broker.close()
        suite.db.close()
        admin = RabbitmqBroker(url=RABBITMQ_URL)
        for name in (warm, cold):
            for queue in (name, dq_name(name), xq_name(name)):
                admin.channel.queue_delete(queue=queue)
        admin.close()


def test_a_publish_whose_reply_timed_out_after_it_went_through_runs_once(private, database_url, key_prefix,
                                                                         monkeypatch):
    """The publish reached the broker but its reply timed out: the row is kept pending, so the
    job has two messages (the first, and the re-drive's); it runs once, the other copy skipped."""
    broker, suite = redis_rig(private, database_url, key_prefix)
    runs = Runs()
    tracked, unique = declare(runs)
    publish = broker.do_enqueue

    def went_through_then_timed_out(*args):
        publish(*args)
        raise redis.TimeoutError("Timeout reading from socket")

    monkeypatch.setattr(broker, "do_enqueue", went_through_then_timed_out)
    try:
        messages = [tracked.send(1), unique.send(key=1)]
        monkeypatch.undo()
        assert [job_of(m).status for m in messages] == ["pending"] * 2
        with running_worker(broker, threads=4):
            wait_until(lambda: dramatiq_unique.redrive().sent == 0 and all(
                job_of(m).status == SUCCEEDED for m in messages), timeout=15, what="both jobs to succeed")
        assert runs.counts == {("tracked", 1): 1, ("unique", 1): 1}
    finally:
        broker.close()
        suite.db.close()
