"""The hot statements as PostgreSQL prepared statements over psycopg2: parsed and planned once per connection.

Measured on this project's 2-core machine, an attempt's start (an
``UPDATE ... WHERE id = ... RETURNING``) costs the server about 210 us of
CPU sent as text and about 145 us as ``EXECUTE`` of a statement prepared
on the connection.  A tracked job makes three such statements (send,
start, outcome), on a machine whose cores the workers share with the
database, so the saving shows in the jobs per second.

Each connection (peewee keeps one per thread) prepares a statement the
first time it runs it, outside a transaction of the caller's.  A
statement the server will not prepare (a parameter whose type it cannot
infer) is sent as text from then on.  A connection pooler that drops
prepared statements (``DISCARD ALL``) is survived: an unknown statement
is prepared again.  A pooler in *transaction* mode, which hands each
transaction another server connection, needs ``prepared_statements=False``
in :func:`dramatiq_unique.setup`.

psycopg 3 (a peewee database of the caller's that uses it) prepares by
itself after ``prepare_threshold`` runs of a statement on a connection, so
its statements go straight to it.  The suite opens URLs with psycopg2 and
this layer: measured against psycopg 3's own preparation (issue 16 part 3,
tests/benchmarks/README.md), the single statements cost the same, but
``send_many`` ran about 30% slower on psycopg 3 (its adaptation of a
batch's thousands of parameters).

Reconnects (:mod:`dramatiq_unique.storage.database`): the names are kept per
connection object, so a connection that replaced a dead one starts with
none prepared; an ``EXECUTE`` that a reconnect re-ran on the new session
fails with "prepared statement ... does not exist" and is prepared there.
"""

from __future__ import annotations

import re
import threading
import weakref
from typing import Any, Sequence

import peewee as pw

from dramatiq_unique.storage.database import is_psycopg3
from dramatiq_unique.storage.models import is_postgres

#: Set on a peewee Database whose statements are not to be prepared.
_OFF = "_dramatiq_unique_no_prepare"

_names: dict[str, str] = {}  # statement text: its prepared name
_calls: dict[tuple, str] = {}  # (name, parameters): the EXECUTE text
_unpreparable: set[str] = set()
_names_lock = threading.Lock()


class _Local(threading.local):
    def __init__(self) -> None:
        # Per connection: the names prepared on it (a new connection starts empty).
        self.done: "weakref.WeakKeyDictionary[Any, set[str]]" = weakref.WeakKeyDictionary()


_local = _Local()


def enable(db: pw.Database, on: bool) -> None:
    """Whether ``db``'s hot statements are prepared (the ``prepared_statements`` setting)."""
    setattr(db, _OFF, not on)


def execute(db: pw.Database, sql: str, params: Sequence[Any]) -> Any:
    """``db.execute_sql(sql, params)``, as a prepared statement where it can be; returns the cursor."""
    if getattr(db, _OFF, True) or not is_postgres(db) or is_psycopg3(db):
        return db.execute_sql(sql, params)  # psycopg 3 prepares by itself (its prepare_threshold)
    name = _name(sql)
    if name is None:
        return db.execute_sql(sql, params)
    if name not in _done(db):
        if db.in_transaction() or not _prepare(db, name, sql):
            return db.execute_sql(sql, params)  # a failed PREPARE would abort the caller's transaction
        _done(db).add(name)  # on the connection it ran on: a reconnect may have replaced the one above
    call = _calls.get((name, len(params)))
    if call is None:
        args = f"({', '.join(['%s'] * len(params))})" if params else ""
        call = _calls.setdefault((name, len(params)), f"EXECUTE {name}{args}")
    try:
        return db.execute_sql(call, params)
    except pw.DatabaseError as e:
        if "prepared statement" not in str(e) or db.in_transaction():
            raise
        # A pooler dropped it, or the database reconnected (a new session has no
        # prepared statements): prepare it again, once, on the connection now in use.
        _done(db).discard(name)
        if not _prepare(db, name, sql):
            return db.execute_sql(sql, params)
        _done(db).add(name)
        return db.execute_sql(call, params)


def _done(db: pw.Database) -> "set[str]":
    """The names prepared on this thread's current connection of ``db`` (a new connection has none)."""
    conn = db.connection()
    done = _local.done.get(conn)
    if done is None:
        done = _local.done[conn] = set()
    return done


def _name(body: str) -> "str | None":
    name = _names.get(body)
    if name is None:
        with _names_lock:
            name = _names.setdefault(body, f"dramatiq_unique_{len(_names) + 1}")
    return None if name in _unpreparable else name


def _prepare(db: pw.Database, name: str, body: str) -> bool:
    count = iter(range(1, body.count("%s") + 1))
    text = re.sub(r"%s", lambda _: f"${next(count)}", body)
    try:
        db.execute_sql(f"PREPARE {name} AS {text}")
        return True
    except pw.DatabaseError as e:
        if "already exists" in str(e):
            return True
        if isinstance(e, pw.ProgrammingError):  # the statement itself (not the connection): for good
            _unpreparable.add(name)
        return False
