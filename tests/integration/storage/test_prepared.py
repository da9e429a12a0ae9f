"""Prepared statements on PostgreSQL (dramatiq_unique.storage.queries), on a real server."""

from __future__ import annotations

import logging
from typing import Iterator

import dramatiq
import peewee as pw
import pytest

import dramatiq_unique
from dramatiq_unique.storage import queries
from dramatiq_unique.storage.database import is_psycopg3
from tests.conftest import REDIS_URL
from tests.helpers import wait_until


def prepared_here(suite) -> set[str]:
    """The statements prepared on the calling thread's connection."""
    rows = suite.db.execute_sql("SELECT name FROM pg_prepared_statements").fetchall()
    return {name for (name,) in rows}


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


def test_a_send_is_prepared_once_and_a_statement_gone_from_its_connection_turns_preparing_off(
        make_suite, broker, caplog):
    """Given tracked sends on one connection, Then the insert is prepared there once; When the
    connection's prepared statements are gone under it (as where a pooler in transaction mode lends
    another server connection), Then the next send is recorded all the same, unprepared, and the suite
    prepares nothing more on that database, with a warning."""
    suite = make_suite()

    @dramatiq.actor(track=True)
    def job(n):
        pass

    job.send(1)
    names = prepared_here(suite)
    assert len(names) == 1 and all(n.startswith("dramatiq_unique_") for n in names)
    job.send(2)
    assert prepared_here(suite) == names, "prepared once, not per send"
    suite.db.execute_sql("DEALLOCATE ALL")
    with caplog.at_level(logging.WARNING, logger="dramatiq_unique.storage.queries"):
        third = job.send(3)
    assert dramatiq_unique.get_job(third.message_id).status == "queued"
    assert "pooler in transaction mode" in caplog.text
    assert not getattr(suite.db, queries._ON)
    assert dramatiq_unique.get_job(job.send(4).message_id).status == "queued"
    assert prepared_here(suite) == set(), "nothing prepared again"


def test_jobs_run_and_record_with_prepared_statements_and_without(make_suite, broker):
    """Given either setting, Then a worker's start and outcome are recorded, and with the
    setting off nothing is prepared."""
    for on in (True, False):
        suite = make_suite(prepared_statements=on)

        @dramatiq.actor(actor_name=f"job_{on}", track=True)
        def job(n):
            return n * 2

        worker = dramatiq.Worker(broker, worker_timeout=50, worker_threads=2)
        worker.start()
        try:
            sent = [job.send(n) for n in range(5)]
            wait_until(lambda sent=sent: all(dramatiq_unique.get_job(m.message_id).status == "succeeded" for m in sent),
                       timeout=10, what="the jobs to succeed")
            assert bool(prepared_here(suite)) is on  # the sends' (the worker closes this connection at stop)
        finally:
            worker.stop()
        assert [dramatiq_unique.get_job(m.message_id).result for m in sent] == [0, 2, 4, 6, 8]
        suite.db.close()


def test_a_statement_the_server_cannot_prepare_is_sent_as_text(make_suite):
    """Given a statement whose parameter type the server cannot infer, Then it is sent as text."""
    suite = make_suite()
    query = queries.Query.of("SELECT %(value)s IS NULL", postgres=True)
    assert queries.execute(suite.db, query, {"value": None}).fetchone() == (True,)
    assert queries.execute(suite.db, query, {"value": 1}).fetchone() == (False,)
    assert not prepared_here(suite)


#: Runs after which psycopg 3 has prepared a statement (its default prepare_threshold is 5).
PREPARED_AFTER = 6


@pytest.mark.parametrize("on", [True, False])
def test_a_given_psycopg_3_database_prepares_by_itself(make_suite, broker, pg_url, on):
    """Given a peewee PostgresqlDatabase on psycopg 3, Then the suite keeps it and its driver, our
    PREPARE/EXECUTE layer stands aside (psycopg 3 binds parameters on the server: an EXECUTE of ours
    would fail), tracked jobs run and record, and psycopg 3 prepares the send after a few, unless
    prepared_statements=False (prepare_threshold=None)."""
    from playhouse.db_url import parse

    params = parse(pg_url)
    db = pw.PostgresqlDatabase(params.pop("database"), prefer_psycopg3=True, **params)
    suite = make_suite(database=db, prepared_statements=on)
    assert suite.db is db and is_psycopg3(db)

    @dramatiq.actor(actor_name=f"job_pg3_{on}", track=True)
    def job(n):
        return n + 1

    sent = [job.send(n) for n in range(PREPARED_AFTER)]
    rows = suite.db.execute_sql("SELECT statement FROM pg_prepared_statements").fetchall()
    inserts = [statement for (statement,) in rows if statement.lstrip().upper().startswith("INSERT")]
    assert len(inserts) == (1 if on else 0)
    worker = dramatiq.Worker(broker, worker_timeout=50, worker_threads=2)
    worker.start()
    try:
        wait_until(lambda: all(dramatiq_unique.get_job(m.message_id).status == "succeeded" for m in sent),
                   timeout=10, what="the jobs to succeed")
    finally:
        worker.stop()
    assert [dramatiq_unique.get_job(m.message_id).result for m in sent] == [1, 2, 3, 4, 5, 6]


def test_a_parking_move_is_one_prepared_statement_and_leaves_the_session_synchronous(make_suite):
    """The parking moves commit without waiting for the WAL flush (storage/jobs.py: _move): one
    statement each, prepared as any other; the setting lasts for that statement's transaction only."""
    from dramatiq_unique import JobModel
    from dramatiq_unique.storage import jobs
    from dramatiq_unique.storage.models import utcnow

    suite = make_suite()
    ids = [jobs.adopt(JobModel, {"message_id": f"m{n}", "actor_name": "job", "queue_name": "default"})[0]
           for n in range(3)]
    for row_id in ids:
        assert jobs.park(JobModel, row_id, 0, "group", {}, utcnow()) is not None
    rows = suite.db.execute_sql("SELECT statement FROM pg_prepared_statements").fetchall()
    assert len([s for (s,) in rows if "WITH moved AS (UPDATE" in s]) == 1
    assert suite.db.execute_sql("SHOW synchronous_commit").fetchone()[0] == "on"
    assert JobModel.select().where(JobModel.parked_on == "group").count() == len(ids)


#: Run in a process of its own: runs the named statements in the order given (argv[2:]) on a connection of
#: its own, prepared, and prints what that session prepared, as JSON {name: statement}.
PREPARING_PROCESS = """
import json, sys
import peewee as pw
from playhouse.db_url import parse
from dramatiq_unique import JobModel
from dramatiq_unique.storage import models, queries, schema

params = parse(sys.argv[1])
db = pw.PostgresqlDatabase(params.pop("database"), **params)
queries.enable(db, True)
values = {"app": "", "hold": "h", "key": "tests.prepared:k", "id": 0, "revision": 0, "succeeded": "succeeded",
          "failed": "failed", "running": "running", "live_after": None, "woken_by": ""}
with db.bind_ctx([JobModel], bind_refs=False, bind_backrefs=False):
    schema.create_or_migrate(JobModel)
    models.create_fence_table(db)
    for name in sys.argv[2:]:
        queries.execute(db, queries.statement(JobModel, name), values).fetchall()
rows = db.execute_sql("SELECT name, statement FROM pg_prepared_statements").fetchall()
print(json.dumps(dict(rows)))
"""


def prepared_by_a_process(pg_url: str, names: list[str]) -> dict[str, str]:
    import json
    import os
    import subprocess
    import sys

    from tests.workers import ROOT

    done = subprocess.run([sys.executable, "-c", PREPARING_PROCESS, pg_url, *names], cwd=ROOT, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def test_a_statement_has_the_same_prepared_name_in_every_process_whatever_their_order(pg_url):
    """Given two processes (two sessions) that prepare the same statements in opposite orders, Then each
    statement has one name in both, and different statements have different names: through a pooler that
    hands one server session to both, a name never runs another statement's text."""
    order = ["holder", "startable", "draw_token"]
    first = prepared_by_a_process(pg_url, order)
    second = prepared_by_a_process(pg_url, order[::-1])
    assert len(first) == len(second) == 3
    assert first == second, "one name, one text, in both processes"
    assert len(set(first.values())) == 3 and all(name.startswith("dramatiq_unique_") for name in first)


def test_a_prepared_name_is_a_hash_of_the_exact_text():
    """Same text, same name, from any two renderings; a text differing by one character, another name."""
    a = queries.Query.of('SELECT 1 FROM "t" WHERE "id" = %(id)s', postgres=True)
    b = queries.Query.of('SELECT 1 FROM "t" WHERE "id" = %(id)s', postgres=True)
    c = queries.Query.of('SELECT 1 FROM "u" WHERE "id" = %(id)s', postgres=True)
    assert a.prepared_name == b.prepared_name != c.prepared_name
    assert a.prepare_sql == 'SELECT 1 FROM "t" WHERE "id" = $1'
    assert a.execute_sql == f"EXECUTE {a.prepared_name}(%(id)s)"
