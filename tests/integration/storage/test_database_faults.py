"""PostgreSQL restarting, crashing or cutting sessions under the suite (dramatiq_unique.storage.database).

Each test runs on a throwaway cluster of its own module (tests/servers.py),
which it restarts, stops, kills, or whose sessions it terminates.  Every
thread that had a connection must recover on its next call once the
server is back, with no process restart; a call while the server is down
raises DatabaseUnavailable at once.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from typing import Iterator

import dramatiq
import peewee as pw
import pytest
from dramatiq.brokers.redis import RedisBroker

import dramatiq_unique
from dramatiq_unique import DatabaseUnavailable, JobModel
from dramatiq_unique.context import MARKER
from dramatiq_unique.parking import lot
from dramatiq_unique.parking.lot import Watchdog
from dramatiq_unique.storage.database import DB_ERRORS
from tests.conftest import REDIS_URL
from tests.durable import running_worker
from tests.helpers import wait_until
from tests.integration.parking.helpers import Delivery, TestGate, sent
from tests.servers import PostgresCluster

pytestmark = pytest.mark.slow

FAULTS = ["restart", "terminate_backends"]


@pytest.fixture(scope="module")
def cluster() -> Iterator[PostgresCluster]:
    cluster = PostgresCluster().start()
    yield cluster
    cluster.remove()


@pytest.fixture
def private_url(cluster: PostgresCluster) -> str:
    """A schema of the test's own on the private cluster (which is up when the test starts)."""
    return cluster.schema_url()



@pytest.fixture
def private_suite(broker, private_url, key_prefix) -> Iterator[dramatiq_unique.Suite]:
    suite = dramatiq_unique.setup(broker, database=private_url, redis=REDIS_URL, key_prefix=key_prefix,
                                  redriver=False, database_connect_timeout=2_000)
    yield suite
    suite.close()


def fault(cluster: PostgresCluster, kind: str) -> None:
    if kind == "restart":
        cluster.restart()
    else:
        assert cluster.terminate_backends() >= 1, "the suite had sessions to cut"


def status(message_id: str) -> str:
    job = dramatiq_unique.get_job(message_id)
    return str(job.status) if job is not None else "missing"


@pytest.mark.parametrize("kind", FAULTS)
def test_a_producer_thread_recovers(private_suite, broker, cluster, kind):
    """Given a thread that sent a tracked job, When the server restarts or cuts its session,
    Then the same thread's next send is recorded (no process restart)."""

    @dramatiq.actor(track=True)
    def produced(n):
        pass

    producer = concurrent.futures.ThreadPoolExecutor(1)  # one thread, keeping its connection
    try:
        first = producer.submit(produced.send, 1).result(timeout=30)
        fault(cluster, kind)
        second = producer.submit(produced.send, 2).result(timeout=30)
        third = producer.submit(produced.send, 3).result(timeout=30)
    finally:
        producer.submit(private_suite.close).result(timeout=30)
        producer.shutdown()
    assert [status(m.message_id) for m in (first, second, third)] == ["queued"] * 3


@pytest.mark.parametrize("kind", FAULTS)
def test_get_job_recovers(private_suite, broker, cluster, kind):
    @dramatiq.actor(track=True)
    def looked_up(n):
        pass

    sent = looked_up.send(1)
    assert status(sent.message_id) == "queued"
    fault(cluster, kind)
    assert status(sent.message_id) == "queued"


@pytest.mark.parametrize("kind", FAULTS)
def test_a_worker_thread_recovers(private_suite, broker, cluster, kind):
    """Given a worker thread that ran a tracked job, When the server restarts or cuts its
    session, Then its next job starts, runs and is recorded, on its first attempt."""
    runs = []

    @dramatiq.actor(track=True, max_retries=0)
    def worked(n):
        runs.append(n)
        return n

    with running_worker(broker, threads=1):
        first = worked.send(1)
        wait_until(lambda: status(first.message_id) == "succeeded", timeout=15, what="the first job")
        fault(cluster, kind)
        second = worked.send(2)
        wait_until(lambda: status(second.message_id) in ("succeeded", "failed"), timeout=15, what="the second job")
    job = dramatiq_unique.get_job(second.message_id)
    assert (str(job.status), job.attempts, job.result, runs) == ("succeeded", 1, 2, [1, 2]), job.last_error


@pytest.mark.parametrize("kind", FAULTS)
def test_the_wakeup_watchdog_recovers(private_suite, broker, cluster, kind):
    """Given the watchdog thread woke a parked job (its thread has a connection), When the
    server restarts or cuts its session, Then it still wakes the next waiter of a dead holder."""
    spot = lot.of(private_suite)
    gate = TestGate(private_suite, spot.wakeups)
    spot.register(gate)
    watchdog = Watchdog(spot.tick, lambda: 50, private_suite.close)
    try:
        for n in range(2):
            if n:
                fault(cluster, kind)
            gate.take("t:g", 200)  # a holder that dies: its lease runs out, nobody leaves
            job = JobModel.create(message_id=f"job-{n}", actor_name="parked_actor", queue_name="default",
                                  args=[n], options={}, app=private_suite.app)
            assert spot.park(gate, "t:g", Delivery(job.message_id), JobModel, job.id, 0, retry_in_ms=250)
            token = wait_until(lambda job=job: _wake_token(broker, job.message_id), timeout=15,
                               what=f"the watchdog to wake job-{n}")
            assert JobModel.get_by_id(job.id).status == "queued"
            spot.leave(gate, "t:g", token)  # the woken job ran
    finally:
        watchdog.stop()


def _wake_token(broker: RedisBroker, message_id: str) -> "str | None":
    """The gate token of job ``message_id``'s wake-up message, once it is published."""
    message = next((m for m in sent(broker) if m.message_id == message_id), None)
    return None if message is None else message.options[MARKER]["wake"]["t"]


def test_a_call_while_the_server_is_down_raises_database_unavailable(private_suite, broker, cluster):
    """Given the server stopped, Then a send and get_job raise DatabaseUnavailable at once
    (nothing is published); When it is back, Then both work again."""

    @dramatiq.actor(track=True)
    def refused(n):
        pass

    sent = refused.send(1)
    cluster.stop()
    began = time.monotonic()
    with pytest.raises(DatabaseUnavailable):
        refused.send(2)
    with pytest.raises(DatabaseUnavailable):
        dramatiq_unique.get_job(sent.message_id)
    assert time.monotonic() - began < 10, "refused, not hung"
    assert broker.client.llen(f"{broker.namespace}:default") == 1, "the refused send published nothing"
    cluster.start()
    assert status(refused.send(3).message_id) == "queued"
    assert status(sent.message_id) == "queued"


def test_a_job_delivered_during_an_outage_runs_after_it(private_suite, broker, cluster):
    """Given a job sent before the outage and delivered while the server is down (its start
    fails), When the server is back, Then Retries' re-send runs it, once."""
    runs = []

    @dramatiq.actor(track=True, max_retries=20, min_backoff=100, max_backoff=500)
    def delayed(n):
        runs.append(n)

    sent = delayed.send(1)
    cluster.stop()
    started = threading.Event()

    def restart_later():
        started.wait(10)
        time.sleep(1.0)  # a few failed starts
        cluster.start()

    restarter = threading.Thread(target=restart_later)
    restarter.start()
    try:
        with running_worker(broker, threads=1):
            started.set()
            wait_until(lambda: runs, timeout=20, what="the job to run after the outage")
            wait_until(lambda: status(sent.message_id) == "succeeded", timeout=10, what="its outcome")
    finally:
        started.set()
        restarter.join(30)
    assert runs == [1]


def test_a_given_peewee_database_recovers_too(broker, cluster, private_url, key_prefix):
    """Given setup(database=PostgresqlDatabase(...)), Then it is adapted to reconnect in place:
    the caller's object keeps working after a restart, and its models share it."""
    from playhouse.db_url import parse

    params = parse(private_url)
    db = pw.PostgresqlDatabase(params.pop("database"), **params)
    suite = dramatiq_unique.setup(broker, database=db, redis=REDIS_URL, key_prefix=key_prefix, redriver=False)
    try:
        assert suite.db is db and isinstance(db, pw.PostgresqlDatabase)

        @dramatiq.actor(track=True)
        def given(n):
            pass

        first = given.send(1)
        cluster.restart()
        assert db.execute_sql("SELECT 1").fetchone() == (1,)
        assert status(given.send(2).message_id) == "queued" and status(first.message_id) == "queued"
    finally:
        suite.close()


def test_a_crash_under_load_hangs_nothing_and_every_sent_job_runs(private_suite, broker, cluster):
    """Given producers sending and a worker running tracked jobs, When the server crashes
    (immediate shutdown) and comes back, Then no thread hangs, every send either returned or
    raised DatabaseUnavailable, and every job whose send returned runs to its end."""
    runs: list[int] = []

    @dramatiq.actor(track=True, max_retries=50, min_backoff=100, max_backoff=300)
    def loaded(n):
        time.sleep(0.005)
        runs.append(n)

    sent, refused, stop = {}, [], threading.Event()

    def produce(base: int) -> None:
        n = base
        while not stop.is_set():
            try:
                sent[n] = loaded.send(n).message_id
            except DatabaseUnavailable:
                refused.append(n)
                time.sleep(0.05)
            n += 1
            time.sleep(0.005)
        private_suite.close()

    with running_worker(broker, threads=2):
        producers = [threading.Thread(target=produce, args=(k * 100_000,)) for k in range(2)]
        for p in producers:
            p.start()
        wait_until(lambda: len(runs) >= 20, timeout=20, what="load")
        cluster.kill()
        time.sleep(0.5)
        cluster.start()
        wait_until(lambda: len(sent) >= len(runs) + 20 or len(sent) > 200, timeout=20, what="sends after the crash")
        stop.set()
        for p in producers:
            p.join(20)
            assert not p.is_alive(), "a producer hung"
        # A job that ran while the server was down could not record its outcome: its row stays
        # running until its lease runs out and the re-drive settles it (not this test's subject).
        args = {m: n for n, m in sent.items()}
        wait_until(lambda: all(status(m) == "succeeded" or (status(m) == "running" and args[m] in runs)
                               for m in sent.values()), timeout=30, what="every sent job to run")
    assert refused, "the outage was seen"
    assert set(runs) >= set(sent), "every sent job ran"


def test_a_cut_inside_a_transaction_is_not_retried_and_the_next_call_works(private_suite, cluster):
    """Given a transaction whose session is cut after a write, Then its next statement fails (no
    silent retry on a new connection, which would commit half of it), nothing of it is kept,
    and the thread's next call, outside it, reconnects."""
    db = private_suite.db
    JobModel.create(message_id="before", actor_name="a", queue_name="default")
    with pytest.raises(DB_ERRORS):
        with db.atomic():
            JobModel.create(message_id="inside-1", actor_name="a", queue_name="default")
            cluster.terminate_backends()
            JobModel.create(message_id="inside-2", actor_name="a", queue_name="default")
    assert not db.in_transaction()
    assert sorted(j.message_id for j in JobModel.select()) == ["before"]


def test_prepared_statements_are_prepared_again_on_the_new_connection(private_suite, broker, cluster):
    """Given tracked sends prepared on a connection, When the session is cut, Then the next send
    reconnects, prepares its statement on the new session and records it there."""
    from dramatiq_unique.storage import queries

    @dramatiq.actor(track=True)
    def prepared_send(n):
        pass

    def names_here() -> set:
        return {n for (n,) in private_suite.db.execute_sql("SELECT name FROM pg_prepared_statements").fetchall()}

    prepared_send.send(1)
    names = names_here()
    assert names
    cluster.terminate_backends()
    assert status(prepared_send.send(2).message_id) == "queued"
    assert names_here() == names, "prepared again on the new session"
    known = queries._prepared[private_suite.db.connection()]
    assert known == names, "and known there, so it is not prepared a third time"
