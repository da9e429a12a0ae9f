"""Opening the job database (dramatiq_unique.storage.database), without a server."""

from __future__ import annotations

import sys

import peewee as pw
import pytest
from playhouse.shortcuts import ReconnectMixin

from dramatiq_unique import InvalidOption
from dramatiq_unique.storage import database
from dramatiq_unique.storage.database import address, describe, open_database, reconnecting
from dramatiq_unique.suite import Settings


def test_a_postgres_url_opens_a_reconnecting_database_with_timeouts():
    db = open_database("postgresql://app:secret@db.example:5433/jobs?options=-csearch_path%3Dx&connect_timeout=9",
                       connect_timeout=2_500, timeout=20_000)
    assert isinstance(db, ReconnectMixin) and isinstance(db, pw.PostgresqlDatabase)
    params = db.connect_params
    assert params["connect_timeout"] == 9, "the URL's own parameter wins"
    assert params["options"] == "-csearch_path=x -c statement_timeout=20000"
    assert params["keepalives"] == 1 and params["tcp_user_timeout"] == 20_000
    assert describe(db) == "PostgreSQL at postgresql://app@db.example:5433/jobs"


def test_a_url_that_sets_its_own_statement_timeout_keeps_it():
    db = open_database("postgresql://h/jobs?options=-c%20statement_timeout%3D5", connect_timeout=1, timeout=9_000)
    assert db.connect_params["options"] == "-c statement_timeout=5"
    assert db.connect_params["connect_timeout"] == 1


def test_a_given_postgres_database_is_adapted_in_place_once():
    db = pw.PostgresqlDatabase("jobs", host="h")
    assert reconnecting(db) is db and reconnecting(db) is db
    assert db._reconnect_errors[pw.InterfaceError] == ["connection already closed", "the connection is closed"]
    assert open_database(db, connect_timeout=3_000) is db and db.connect_params["connect_timeout"] == 3


def test_sqlite_is_left_as_it_was(tmp_path):
    db = open_database(f"sqlite:///{tmp_path}/jobs.db", connect_timeout=1, timeout=1)
    assert type(db) is pw.SqliteDatabase
    given = pw.SqliteDatabase(":memory:")
    assert open_database(given) is given and not hasattr(given, "_reconnect_errors")


@pytest.mark.parametrize("url, says", [
    ("jobs.db", "sqlite:///jobs.db"),
    ("/var/lib/jobs.db", "not a URL"),
    ("postgresql://host", "names no database"),
    ("nosuch://host/db", "nosuch"),
])
def test_urls_that_cannot_be_opened_say_why(url, says):
    with pytest.raises(InvalidOption, match=says):
        open_database(url)


def test_addresses_never_show_a_password():
    assert address("postgresql://u:p@h:1/d?password=x") == "postgresql://u@h:1/d"
    assert address("sqlite:////tmp/x.db") == "sqlite:////tmp/x.db"


@pytest.mark.parametrize("name", ["database_connect_timeout", "database_timeout", "check_timeout"])
def test_timeouts_must_be_positive(name):
    with pytest.raises(InvalidOption, match=name):
        Settings(**{name: 0})


class _Monkey:
    """gevent.monkey as a gevent worker has it: threading patched."""

    @staticmethod
    def is_module_patched(name: str) -> bool:
        return name == "threading"


def test_a_gevent_worker_with_more_greenlets_than_default_threads_is_warned_of(monkeypatch):
    postgres = pw.PostgresqlDatabase("jobs", host="db.internal")
    assert database.greenlet_connections(postgres, 100) is None  # threads: nothing to say
    monkeypatch.setitem(sys.modules, "gevent.monkey", _Monkey)
    warning = database.greenlet_connections(postgres, 100)
    assert warning is not None and "100 gevent greenlets" in warning and "PgBouncer in transaction mode" in warning
    assert database.greenlet_connections(postgres, 8) is None  # no more than Dramatiq's default threads
    assert database.greenlet_connections(pw.SqliteDatabase(":memory:"), 100) is None
    setattr(postgres, database._POOLED, True)  # set-up found a pooler in transaction mode
    assert database.greenlet_connections(postgres, 100) is None
