"""Several job stores: which errors mark a store down.

A store is remembered down (unique sends refused at once, plain tracked sends sent to the next
store) only when it cannot be reached.  A primary that answers with the error of one statement
(a statement timeout, a lock timeout, a deadlock, a SQLite file busy with another writer) is up:
the send that met the error gets it, and the sends after it use the primary as before.  Each
error is made for real, by another connection holding a lock the send needs.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import uuid
from typing import Iterator

import dramatiq
import peewee as pw
import psycopg2
import pytest

import dramatiq_unique
from dramatiq_unique import DatabaseUnavailable, get_job
from dramatiq_unique.context import store_of
from dramatiq_unique.storage.database import DEFAULT_SQLITE_PRAGMAS
from dramatiq_unique.storage.stores import unreachable
from tests.conftest import REDIS_URL
from tests.durable import free_port
from tests.helpers import wait_until

#: ms a store found down stays so: long enough that a test sees it, were it marked.
DOWN_FOR = 60_000
TABLE = "dramatiq_unique_jobs"


def _setup(broker, database, sqlite_url, key_prefix, **settings) -> dramatiq_unique.Suite:
    return dramatiq_unique.setup(broker, database=[database, sqlite_url], redis=REDIS_URL, key_prefix=key_prefix,
                                 redriver=False, store_down_for=DOWN_FOR, **settings)


def _declare():
    # A name of its own: the unique keys a process sent lately (unique/recent.py) are the process's.
    @dramatiq.actor(unique_args=["n"], max_retries=0, actor_name=f"unique_report_{uuid.uuid4().hex[:8]}")
    def unique_report(n):
        pass

    @dramatiq.actor(track=True, max_retries=0)
    def report(n):
        pass

    return unique_report, report


def _primary_still_serves(suite, unique_report, report) -> None:
    assert not suite.stores.is_down(0), "the primary answered: it is not down"
    unique_report.send(100)  # not refused
    sent = report.send(101)
    assert store_of(sent.options) == 0, "a plain tracked row still goes to the primary"
    assert get_job(sent.message_id).message_id == sent.message_id


def _raw(pg_url: str):
    """A psycopg2 connection to the test's schema (the URL's ``options`` carry its search_path)."""
    return psycopg2.connect(pg_url)


@pytest.fixture
def pg_suite(request, broker, pg_url, sqlite_url, key_prefix) -> Iterator[dramatiq_unique.Suite]:
    url = pg_url + getattr(request, "param", "")
    suite = _setup(broker, url, sqlite_url, key_prefix, database_timeout=1_000)
    yield suite
    suite.close()


@pytest.mark.parametrize("pg_suite", ["", "%20-clock_timeout%3D300"], ids=["statement_timeout", "lock_timeout"],
                         indirect=True)
def test_a_timeout_on_the_primary_fails_the_send_and_leaves_the_primary_up(pg_suite, pg_url, broker, caplog):
    """Another connection holds the job table locked: the unique send waits, then gets the
    server's statement timeout (57014) or lock timeout (55P03) as DatabaseUnavailable; a read
    of every store (the dead set) and a re-drive pass leave the primary out, as they do a store
    that is down.  The primary is not remembered down: the next unique and plain sends use it."""
    unique_report, report = _declare()
    unique_report.send(0)
    locker = _raw(pg_url)
    try:
        locker.cursor().execute(f"LOCK TABLE {TABLE} IN ACCESS EXCLUSIVE MODE")
        with pytest.raises(DatabaseUnavailable) as failed:
            unique_report.send(1)
        assert not unreachable(failed.value.__cause__), failed.value
        assert not pg_suite.stores.is_down(0)
        with caplog.at_level(logging.WARNING):
            assert dramatiq_unique.dead_jobs() == []
        assert "rows are left out" in caplog.text and not pg_suite.stores.is_down(0)
        assert dramatiq_unique.redrive(broker).errors == 1 and not pg_suite.stores.is_down(0)
    finally:
        locker.rollback()
        locker.close()
    _primary_still_serves(pg_suite, unique_report, report)


def test_a_deadlock_on_the_primary_fails_the_send_and_leaves_the_primary_up(broker, pg_url, sqlite_url, key_prefix):
    """Another transaction inserted a row of the send's unique key (uncommitted): the send's INSERT waits
    for it, holding the table's ROW EXCLUSIVE lock; that transaction then asks for SHARE on the
    table: a deadlock, which PostgreSQL breaks by failing the send's statement (40P01, the send
    detects it first: its deadlock_timeout is the shorter)."""
    pg_suite = _setup(broker, pg_url, sqlite_url, key_prefix)  # its statement timeout, 30 s, never comes
    unique_report, report = _declare()
    pid = pg_suite.db.execute_sql("SELECT pg_backend_pid()").fetchone()[0]
    other = _raw(pg_url)
    holding, errors = threading.Event(), []
    try:
        cursor = other.cursor()
        first = unique_report.send(1)  # a row of the key, copied below
        pg_suite.db.execute_sql(f"UPDATE {TABLE} SET unique_hold = NULL")  # it let the key go
        cursor.execute("SET deadlock_timeout = '60s'")

        def lock_after_the_send_waits() -> None:
            try:  # the other transaction takes the key, and commits nothing
                cursor.execute(f"INSERT INTO {TABLE} (app, message_id, actor_name, queue_name, args, kwargs, "
                               "options, status, attempts, created_at, unique_key, unique_hold, revision, "
                               "fencing_token) SELECT app, 'other-' || message_id, actor_name, queue_name, args, "
                               "kwargs, options, status, attempts, created_at, unique_key, unique_key, revision, "
                               f"fencing_token FROM {TABLE} WHERE message_id = %s", (first.message_id,))
                holding.set()
                watch = _raw(pg_url)
                watch.autocommit = True
                wait_until(lambda: _waits(watch, pid), timeout=30, what="the send waits on the other's row")
                watch.close()
                cursor.execute(f"LOCK TABLE {TABLE} IN SHARE MODE")  # waits on the send: the deadlock
            except BaseException as e:  # noqa: BLE001 - reported below
                errors.append(e)

        thread = threading.Thread(target=lock_after_the_send_waits)
        thread.start()
        assert holding.wait(30)
        with pytest.raises(DatabaseUnavailable, match="deadlock") as failed:
            unique_report.send(1)
        assert not unreachable(failed.value.__cause__)
        thread.join(30)
        assert not errors and not thread.is_alive(), errors
        other.rollback()  # its LOCK TABLE was granted once the send's statement failed
        _primary_still_serves(pg_suite, unique_report, report)
    finally:
        other.close()
        pg_suite.close()


def _waits(conn, pid: int) -> bool:
    cursor = conn.cursor()
    cursor.execute("SELECT count(*) FROM pg_locks WHERE pid = %s AND NOT granted", (pid,))
    return cursor.fetchone()[0] > 0


def test_a_busy_sqlite_primary_fails_the_send_and_stays_up(broker, tmp_path, sqlite_url, key_prefix):
    """Another connection holds the SQLite primary's write lock past its busy timeout: a unique
    send and a plain tracked one get SQLITE_BUSY as DatabaseUnavailable (the plain one is not sent
    to the secondary: the primary answers), and the primary is not remembered down."""
    path = tmp_path / "primary.db"
    primary = pw.SqliteDatabase(str(path), pragmas={**DEFAULT_SQLITE_PRAGMAS, "busy_timeout": 200})
    suite = _setup(broker, primary, sqlite_url, key_prefix)
    try:
        unique_report, report = _declare()
        unique_report.send(0)
        writer = sqlite3.connect(str(path), isolation_level=None)
        writer.execute("BEGIN IMMEDIATE")
        try:
            for send in (lambda: unique_report.send(1), lambda: report.send(2)):
                with pytest.raises(DatabaseUnavailable, match="locked") as failed:
                    send()
                assert not unreachable(failed.value.__cause__)
        finally:
            writer.execute("ROLLBACK")
            writer.close()
        _primary_still_serves(suite, unique_report, report)
    finally:
        suite.close()


def test_a_primary_that_cannot_be_reached_is_still_remembered_down(broker, sqlite_url, key_prefix):
    """A real outage (nothing listens on the primary's port: connection refused) still marks it
    down: a plain tracked send goes to the secondary.  A repeated unique send, looked up before
    its insert (unique/recent.py), remembers it down too, and while it is, is refused at once
    without asking it, as the insert is: it needs the primary."""
    url = f"postgresql://postgres@127.0.0.1:{free_port()}/test"
    suite = _setup(broker, url, sqlite_url, key_prefix)
    try:
        unique_report, report = _declare()
        assert store_of(report.send(1).options) == 1 and suite.stores.is_down(0)
        suite.stores.mark_up(0)
        with pytest.raises(DatabaseUnavailable):
            unique_report.send(1)  # a key new to the process: its insert finds the primary down
        assert suite.stores.is_down(0)
        suite.stores.mark_up(0)
        with pytest.raises(DatabaseUnavailable):
            unique_report.send(1)  # a key sent lately: looked up first
        assert suite.stores.is_down(0), "the lookup remembers the primary down, as the insert does"
        with pytest.raises(DatabaseUnavailable, match="needs the primary"):
            unique_report.send(1)
    finally:
        suite.close()


def test_a_repeated_unique_send_is_refused_while_the_primary_is_remembered_down(broker, two_sqlite, key_prefix):
    """While the primary is remembered down, a unique send of a key sent lately is refused at once,
    as one of a new key is, not answered from the primary it needs."""
    suite = dramatiq_unique.setup(broker, database=two_sqlite, redis=REDIS_URL, key_prefix=key_prefix,
                                  redriver=False, store_down_for=DOWN_FOR)
    try:
        unique_report, _ = _declare()
        unique_report.send(1)
        suite.stores.mark_down(0, "the test says so")
        for n in (1, 2):
            with pytest.raises(DatabaseUnavailable, match="needs the primary"):
                unique_report.send(n)
    finally:
        suite.close()


@pytest.fixture
def two_sqlite(tmp_path) -> list[str]:
    return [f"sqlite:///{tmp_path / 'a.db'}", f"sqlite:///{tmp_path / 'b.db'}"]
