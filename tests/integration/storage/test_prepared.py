"""Prepared statements on PostgreSQL: psycopg 3 prepares what a connection runs often
(its ``prepare_threshold``; storage/database.py), on a real server."""

from __future__ import annotations

from typing import Iterator

import dramatiq
import peewee as pw
import pytest

import dramatiq_unique
from dramatiq_unique.storage.database import is_psycopg3
from tests.conftest import REDIS_URL
from tests.helpers import wait_until

#: Sends after which psycopg 3 has prepared the send's INSERT (its default prepare_threshold is 5).
PREPARED_AFTER = 6


def prepared_here(suite, kind: str = "") -> set[str]:
    """The statements prepared on the calling thread's connection (those that start with ``kind``)."""
    rows = suite.db.execute_sql("SELECT name, statement FROM pg_prepared_statements").fetchall()
    return {name for (name, statement) in rows if statement.lstrip().upper().startswith(kind)}


@pytest.fixture
def make_suite(broker, pg_url, key_prefix) -> Iterator:
    made = []

    def make(database=None, **settings):
        suite = dramatiq_unique.setup(broker, database=database or pg_url, redis=REDIS_URL, key_prefix=key_prefix,
                                      redriver=False, **settings)
        made.append(suite)
        return suite

    yield make
    for suite in made:
        suite.db.close()


def test_a_url_opens_with_psycopg_3_which_prepares_a_send_once_and_survives_deallocate(make_suite, broker):
    """Given tracked sends on one connection of a URL's database, Then it is psycopg 3's and the
    insert is prepared there after a few sends, once; When the connection's prepared statements
    are dropped (DEALLOCATE ALL), Then the next sends are recorded and prepare it again."""
    suite = make_suite()
    assert is_psycopg3(suite.db)

    @dramatiq.actor(track=True)
    def job(n):
        pass

    for n in range(PREPARED_AFTER):
        job.send(n)
    names = prepared_here(suite, "INSERT")
    assert len(names) == 1
    for n in range(PREPARED_AFTER):
        job.send(100 + n)
    assert prepared_here(suite, "INSERT") == names, "prepared once, not per send"
    suite.db.execute_sql("DEALLOCATE ALL")
    sent = [job.send(200 + n) for n in range(PREPARED_AFTER)]
    assert all(dramatiq_unique.get_job(m.message_id).status == "queued" for m in sent)
    assert len(prepared_here(suite, "INSERT")) == 1


def test_jobs_run_and_record_with_prepared_statements_and_without(make_suite, broker):
    """Given either setting, Then a worker's start and outcome are recorded, and with the
    setting off (prepare_threshold=None) nothing is prepared."""
    for on in (True, False):
        suite = make_suite(prepared_statements=on)
        assert ("prepare_threshold" not in suite.db.connect_params) is on

        @dramatiq.actor(actor_name=f"job_{on}", track=True)
        def job(n):
            return n * 2

        worker = dramatiq.Worker(broker, worker_timeout=50, worker_threads=2)
        worker.start()
        try:
            sent = [job.send(n) for n in range(PREPARED_AFTER)]
            wait_until(lambda sent=sent: all(dramatiq_unique.get_job(m.message_id).status == "succeeded" for m in sent),
                       timeout=10, what="the jobs to succeed")
            assert bool(prepared_here(suite)) is on  # the sends' (the worker closes this connection at stop)
        finally:
            worker.stop()
        assert [dramatiq_unique.get_job(m.message_id).result for m in sent] == [0, 2, 4, 6, 8, 10]
        suite.db.close()


def test_a_given_psycopg2_database_is_kept_and_its_statements_sent_as_text(make_suite, broker, pg_url):
    """Given a peewee PostgresqlDatabase on psycopg2, Then the suite keeps it (and its driver), and
    tracked jobs run and record on it, nothing prepared."""
    pytest.importorskip("psycopg2")
    from playhouse.db_url import parse

    params = parse(pg_url)
    db = pw.PostgresqlDatabase(params.pop("database"), **params)
    suite = make_suite(database=db)
    assert suite.db is db and not is_psycopg3(db)

    @dramatiq.actor(actor_name="job_pg2", track=True)
    def job(n):
        return n + 1

    worker = dramatiq.Worker(broker, worker_timeout=50, worker_threads=2)
    worker.start()
    try:
        sent = [job.send(n) for n in range(PREPARED_AFTER)]
        wait_until(lambda: all(dramatiq_unique.get_job(m.message_id).status == "succeeded" for m in sent),
                   timeout=10, what="the jobs to succeed")
        assert not prepared_here(suite)
    finally:
        worker.stop()
    assert [dramatiq_unique.get_job(m.message_id).result for m in sent] == [1, 2, 3, 4, 5, 6]


def test_a_parking_move_is_one_statement_prepared_and_leaves_the_session_synchronous(make_suite):
    """The parking moves commit without waiting for the WAL flush (storage/parking_statements.py): one
    statement each, so psycopg 3 prepares it; the setting lasts for that statement's transaction only."""
    from dramatiq_unique import JobModel
    from dramatiq_unique.storage import jobs, parking_statements
    from dramatiq_unique.storage.models import utcnow

    suite = make_suite()
    ids = [jobs.insert(JobModel, {"message_id": f"m{n}", "actor_name": "job", "queue_name": "default"})
           for n in range(PREPARED_AFTER + 2)]
    for row_id in ids:
        assert parking_statements.park(JobModel, row_id, 0, "group", {}, utcnow()) is not None
    assert len(prepared_here(suite, "WITH MOVED AS (UPDATE")) == 1
    assert suite.db.execute_sql("SHOW synchronous_commit").fetchone()[0] == "on"
    parked = JobModel.select().where(JobModel.parked_on == "group").count()
    assert parked == len(ids)
