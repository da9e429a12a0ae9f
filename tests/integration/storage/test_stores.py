"""Several job stores (``setup(database=[primary, secondary])``): a throwaway PostgreSQL cluster
as the primary, stopped and started again under the test, and a SQLite file as the secondary;
then two SQLite stores for what the re-drive and get_job() do over both."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from datetime import timedelta
from typing import Iterator
from urllib.parse import urlparse

import dramatiq
import peewee as pw
import pytest

import dramatiq_unique
from dramatiq_unique import DatabaseUnavailable, JobModel, get_job
from dramatiq_unique.context import MARKER, store_of
from dramatiq_unique.storage.models import utcnow
from dramatiq_unique.storage.stores import STORE
from tests.conftest import PG_URL, REDIS_URL
from tests.durable import passes, running_worker, total, wipe_broker
from tests.helpers import LOST_AFTER, wait_until
from tests.servers import PostgresCluster

#: ms a failed store is skipped by sends that may go elsewhere (short, so the test sees it end).
DOWN_FOR = 200


@pytest.fixture(scope="module")
def cluster() -> Iterator[PostgresCluster]:
    cluster = PostgresCluster().start()  # once per module: initdb costs seconds
    yield cluster
    cluster.remove()


@pytest.fixture
def primary_url(cluster: PostgresCluster) -> str:
    """A schema of the test's own on the throwaway cluster, started if a test left it stopped."""
    return cluster.schema_url()


@pytest.fixture
def stores_suite(broker, primary_url, sqlite_url, key_prefix) -> Iterator[dramatiq_unique.Suite]:
    suite = dramatiq_unique.setup(
        broker, database=[primary_url, sqlite_url], redis=REDIS_URL, key_prefix=key_prefix, redriver=False,
        database_connect_timeout=2_000, store_down_for=DOWN_FOR, lost_after=LOST_AFTER,
    )
    yield suite
    suite.close()


def store(message) -> int:
    job = get_job(message.message_id)
    assert job is not None, message.message_id
    return int((job.options.get(MARKER) or {}).get(STORE, 0))


def test_send_many_fails_over_a_plain_tracked_batch_and_a_unique_one_needs_the_primary(stores_suite, broker, cluster):
    """send_many while the primary is down: a tracked batch goes whole to the secondary (its messages
    name it) and runs; a unique batch raises DatabaseUnavailable and sends nothing."""
    runs: list = []

    @dramatiq.actor(track=True, max_retries=0)
    def report(n):
        runs.append(n)

    @dramatiq.actor(unique_args=["n"], max_retries=0)
    def unique_report(n):
        runs.append(("unique", n))

    stores_suite.settings.send_many_batch = 4
    cluster.stop()
    try:
        messages = dramatiq_unique.send_many(report, [(n,) for n in range(10)])
        assert [store(m) for m in messages] == [1] * 10 and all(store_of(m.options) == 1 for m in messages)
        with pytest.raises(DatabaseUnavailable):
            dramatiq_unique.send_many(unique_report, [(1,), (2,)])
        with running_worker(broker):
            wait_until(lambda: sorted(runs) == list(range(10)), timeout=10, what="the secondary's jobs ran")
    finally:
        cluster.start()


def test_with_the_primary_down_tracked_jobs_land_in_the_secondary_and_unique_sends_raise(
    stores_suite, broker, cluster, caplog
):
    """Given a PostgreSQL primary and a SQLite secondary, When the primary stops, Then tracked sends
    land in the secondary and run, unique sends raise; When it starts again, Then new rows go to it,
    unique sends work, and the re-drive recovers a job lost while its row was in the secondary."""
    runs: list = []

    @dramatiq.actor(track=True, max_retries=0)
    def report(n):
        runs.append(n)
        assert dramatiq_unique.current_job().args == [n]  # the whole row, read from its store
        return n

    @dramatiq.actor(unique_args=["n"], unique_lock="until_executed", max_retries=0)
    def unique_report(n):
        runs.append(("unique", n))

    @dramatiq.actor(track=True, max_retries=1, min_backoff=10, max_backoff=10)
    def flaky(n):
        runs.append(("flaky", n))
        if dramatiq_unique.current_job().attempts == 1:
            raise RuntimeError("the first attempt fails")

    first = report.send(0)
    assert store(first) == 0 and type(get_job(first.message_id)) is JobModel

    cluster.stop()
    began = time.monotonic()
    lost = report.send(100)
    # The broker loses both messages: only the rows know the jobs, first's in the primary, lost's in the secondary.
    assert wipe_broker(broker) > 0
    sent = [report.send(n) for n in (1, 2, 3)]
    assert time.monotonic() - began < 5, "sends while the primary is down do not wait for it"
    assert [store(m) for m in (lost, *sent)] == [1, 1, 1, 1]
    assert store_of(sent[0].options) == 1, "the message names its row's store"
    retried = flaky.send(7)
    broker.enqueue(sent[1])  # delivered twice: the second copy finds the job finished (or running) in its store
    with pytest.raises(DatabaseUnavailable):
        unique_report.send(1)
    with pytest.raises(DatabaseUnavailable):
        dramatiq_unique.submit(report, 9, idempotency_key="k-9")

    with running_worker(broker):
        wait_until(lambda: all(get_job(m.message_id).status == "succeeded" for m in (*sent, retried)),
                   timeout=10, what="the secondary's jobs ran, the retry too")
        job = get_job(retried.message_id)
        assert (job.attempts, store(retried)) == (2, 1), "the retry was recorded in the secondary"
        time.sleep(LOST_AFTER / 1000 + 0.05)
        with caplog.at_level(logging.WARNING):
            down_pass = dramatiq_unique.redrive(broker)
        assert down_pass.errors == 1 and "skips job store 0" in caplog.text, "the down primary is skipped"
        assert down_pass.missing == 1, "and the secondary's lost job is looked at all the same (first's waits)"

        cluster.start()
        time.sleep(DOWN_FOR / 1000 + 0.05)
        after = report.send(4)
        assert store(after) == 0, "once the primary answers, new rows go to it"
        unique_report.send(5)
        counts = passes(2)
        assert total(counts, "redriven") == 2 and total(counts, "errors") == 0, "one lost job in each store"
        wait_until(lambda: get_job(lost.message_id).status == get_job(first.message_id).status == "succeeded",
                   timeout=10, what="the lost jobs ran")
        wait_until(lambda: {4, ("unique", 5)} <= set(runs), timeout=10)
    assert sorted(n for n in runs if isinstance(n, int)) == [0, 1, 2, 3, 4, 100], "each job ran once"
    assert runs.count(("flaky", 7)) == 2
    assert store(lost) == 1 and get_job(lost.message_id).attempts == 1


@pytest.fixture(params=["sqlite", "postgres"])
def two_urls(request, tmp_path) -> Iterator[list[str]]:
    """Two SQLite files, or two schemas of the shared PostgreSQL database."""
    if request.param == "sqlite":
        yield [f"sqlite:///{tmp_path / 'a.db'}", f"sqlite:///{tmp_path / 'b.db'}"]
        return
    first = request.getfixturevalue("pg_url")
    other = f"du_{uuid.uuid4().hex[:10]}"
    parsed = urlparse(PG_URL)
    admin = pw.PostgresqlDatabase(parsed.path.lstrip("/"), host=parsed.hostname, port=parsed.port or 5432,
                                  user=parsed.username)
    admin.execute_sql(f'CREATE SCHEMA "{other}"')
    yield [first, f"{PG_URL}?options=-csearch_path%3D{other}"]
    admin.execute_sql(f'DROP SCHEMA "{other}" CASCADE')
    admin.close()


def test_the_redrive_prunes_and_get_job_finds_jobs_in_both_stores(broker, two_urls, key_prefix):
    """Given two stores with jobs in each, the re-drive prunes finished rows in both (counts
    summed), and get_job() finds a job by message id in either, by number with ``store=``."""
    suite = dramatiq_unique.setup(
        broker, database=two_urls, redis=REDIS_URL, key_prefix=key_prefix, redriver=False, store_down_for=60_000,
    )
    try:

        @dramatiq.actor(track=True)
        def report(n):
            return n

        in_primary = report.send(1)
        suite.stores.mark_down(0, "the test says so")  # sends that may fail over go to store 1 meanwhile
        in_secondary = report.send(2)
        suite.stores.mark_up(0)
        assert (store(in_primary), store(in_secondary)) == (0, 1)
        secondary = get_job(in_secondary.message_id)
        assert get_job(secondary.id, store=1).message_id == in_secondary.message_id
        assert get_job(secondary.id) is None or get_job(secondary.id).message_id != in_secondary.message_id

        old = utcnow() - timedelta(days=30)
        for message in (in_primary, in_secondary):
            model = type(get_job(message.message_id))
            model.update(status="succeeded", finished_at=old).where(model.message_id == message.message_id).execute()
        counts = dramatiq_unique.redrive(broker)
        assert counts.pruned == 2 and counts.errors == 0
        assert get_job(in_primary.message_id) is None and get_job(in_secondary.message_id) is None
    finally:
        suite.close()


def test_the_dead_set_lists_retries_and_cancels_jobs_of_either_store(broker, two_urls, key_prefix):
    """Given a failed job in each of two stores and a waiting one in the secondary, dead_jobs()
    lists both failed ones, retry_job() runs the secondary's again there, and cancel_job()
    cancels the waiting one in its store."""
    suite = dramatiq_unique.setup(
        broker, database=two_urls, redis=REDIS_URL, key_prefix=key_prefix, redriver=False, store_down_for=60_000,
    )
    try:

        @dramatiq.actor(track=True, max_retries=0)
        def charge(n):
            if dramatiq_unique.current_job().attempts < 2:
                raise ValueError("declined")
            return n

        first = charge.send(1)
        suite.stores.mark_down(0, "the test says so")
        second = charge.send(2)
        waiting = charge.send_with_options(args=(3,), delay=60_000)
        suite.stores.mark_up(0)
        assert (store(first), store(second), store(waiting)) == (0, 1, 1)
        with running_worker(broker):
            wait_until(lambda: len(dramatiq_unique.dead_jobs(actor_name="charge")) == 2, timeout=10)
            dead = {job.message_id for job in dramatiq_unique.dead_jobs(actor_name="charge")}
            assert dead == {first.message_id, second.message_id}
            dramatiq_unique.retry_job(second.message_id)
            wait_until(lambda: get_job(second.message_id).status == "succeeded", timeout=10)
        assert store(second) == 1 and get_job(second.message_id).attempts == 2
        assert dramatiq_unique.cancel_job(waiting.message_id).status == "cancelled"
        assert get_job(waiting.message_id, store=1).status == "cancelled"
        assert [job.message_id for job in dramatiq_unique.dead_jobs()] == [first.message_id]
    finally:
        suite.close()


def test_setup_with_the_primary_down_succeeds_and_makes_its_tables_when_it_answers(
    broker, primary_url, sqlite_url, key_prefix, cluster, caplog
):
    """Given the primary stopped at set-up, setup() succeeds on the secondary with a warning naming
    the primary; When the primary answers, a unique send with an execution lock (fencing table and
    job table made then) runs there."""
    cluster.stop()
    with caplog.at_level(logging.WARNING):
        suite = dramatiq_unique.setup(
            broker, database=[primary_url, sqlite_url], redis=REDIS_URL, key_prefix=key_prefix, redriver=False,
            database_connect_timeout=2_000, store_down_for=DOWN_FOR,
        )
    try:
        assert "store 0" in caplog.text and "did not answer at set-up" in caplog.text
        runs = []

        @dramatiq.actor(unique_args=["n"])  # until_and_while_executing: a queue lock, then an execution lock
        def locked(n):
            runs.append(n)

        @dramatiq.actor(track=True)
        def plain(n):
            runs.append(n)

        early = plain.send(1)
        assert store(early) == 1
        cluster.start()
        time.sleep(DOWN_FOR / 1000 + 0.05)
        message = locked.send(2)
        assert store(message) == 0
        with running_worker(broker):
            wait_until(lambda: sorted(runs) == [1, 2], timeout=10)
            wait_until(lambda: get_job(message.message_id).status == "succeeded", timeout=5)
        assert get_job(message.message_id).fencing_token >= 1, "the execution lock drew a token in the primary"
    finally:
        suite.close()


@pytest.mark.slow
def test_tracked_sends_go_on_through_a_primary_crash_and_every_job_runs(stores_suite, broker, cluster):
    """Given producers sending tracked jobs and a worker running them, When the primary is killed
    (``pg_ctl stop -m immediate``) and started again mid-run, Then no send raises, the sends during
    the outage land in the secondary, and every job runs (a job whose outcome met the outage runs
    again once its short lease ran out: at least once)."""
    runs: list = []

    @dramatiq.actor(track=True, unique_ttl=300, max_retries=3, min_backoff=20, max_backoff=50)
    def tick(n):
        runs.append(n)

    sent: list = []
    errors: list = []
    stop = threading.Event()

    def produce(first: int) -> None:
        n = first
        while not stop.is_set():
            try:
                sent.append(tick.send(n))
            except Exception as e:  # noqa: BLE001 - counted: the test asserts there are none
                errors.append(e)
            n += 1
            time.sleep(0.005)

    with running_worker(broker, threads=4):
        producers = [threading.Thread(target=produce, args=(k * 1_000_000,)) for k in range(2)]
        for thread in producers:
            thread.start()
        time.sleep(0.3)
        cluster.stop(mode="immediate")
        time.sleep(0.6)
        cluster.start()
        time.sleep(0.4)
        stop.set()
        for thread in producers:
            thread.join(timeout=10)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            dramatiq_unique.redrive(broker)
            if all((job := get_job(m.message_id)) is not None and job.status == "succeeded" for m in sent):
                break
            time.sleep(0.2)
    assert not errors, errors[:3]
    stores = [store(m) for m in sent]
    assert stores.count(1) > 0 and stores.count(0) > 0, "the outage's sends went to the secondary, the others not"
    assert all(get_job(m.message_id).status == "succeeded" for m in sent)
    assert {m.args[0] for m in sent} <= set(runs)
    print(f"STORES primary crash: sends={len(sent)} secondary={stores.count(1)} reruns={len(runs) - len(set(runs))}")
