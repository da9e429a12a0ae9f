"""The executor of ``queries.sql``: its named statements rendered per job table, and run, prepared where
it can be (docs/discussions/how-it-is-built.md, "Storage", says how and why)."""

from __future__ import annotations

import hashlib
import logging
import re
import weakref
from dataclasses import dataclass
from importlib import resources
from typing import Any, Mapping, Optional, Sequence

import peewee as pw

from dramatiq_unique.storage.database import describe, is_postgres, is_psycopg3

logger = logging.getLogger(__name__)

#: A peewee model class with a job table (this module imports no model: the schema uses it too).
Model = type[pw.Model]

#: The file of named statements (package data, read through importlib.resources), for messages.
PATH = "dramatiq_unique/storage/queries.sql"
#: The fencing-token table.
FENCES = "dramatiq_unique_fences"
#: Prefix of the prepared statements' names.
PREFIX = "dramatiq_unique_"

_HEADER = re.compile(r"^-- name: (\w+)(?: \((postgresql|sqlite)\))? --[ \t]*$", re.M)
_PARAM = re.compile(r"%\((\w+)\)s")
_IDENTIFIER = re.compile(r"\{(jobs|fences|columns|order_by|fields|values|assignments|rows)\}")
_WORD = re.compile(r"\w+")


def parse(text: str) -> dict[tuple[str, Optional[str]], str]:
    """The statements of a queries file: {(name, dialect or None): the SQL, its lines joined by spaces}."""
    split = _HEADER.split(text)  # the preamble, then (name, dialect, body) again and again
    found: dict[tuple[str, Optional[str]], str] = {}
    for name, dialect, body in zip(split[1::3], split[2::3], split[3::3], strict=True):
        lines = [line.strip() for line in body.splitlines()]
        sql = " ".join(line for line in lines if line and not line.startswith("--"))
        if not sql or (name, dialect) in found:
            raise ValueError(f"{PATH}: statement {name} ({dialect or 'both dialects'}) is empty or written twice")
        found[(name, dialect)] = sql
    return found


STATEMENTS = parse(resources.files(__package__).joinpath("queries.sql").read_text(encoding="utf-8"))


def dialect_of(db: pw.Database) -> str:
    return "postgresql" if is_postgres(db) else "sqlite"


def quote(db: pw.Database, name: str) -> str:
    """``name`` quoted as an identifier of ``db`` (peewee keeps its pair of quote characters as one string)."""
    return f"{db.quote[0]}{name}{db.quote[1]}"


def table(db: pw.Database, name: str, schema: Optional[str] = None) -> str:
    return f"{quote(db, schema)}.{quote(db, name)}" if schema else quote(db, name)


@dataclass(frozen=True)
class Query:
    """A statement rendered for one job table and dialect: its text, and how it runs prepared."""

    sql: str
    #: PostgreSQL: the prepared statement's name (a hash of its text), its text with ``$n`` marks, and
    #: the ``EXECUTE`` that runs it with the same parameters as :attr:`sql`.
    prepared_name: str = ""
    prepare_sql: str = ""
    execute_sql: str = ""
    #: The parameters, by name, in the order of their first mark.
    params: tuple[str, ...] = ()

    @classmethod
    def of(cls, sql: str, postgres: bool) -> "Query":
        """``sql`` (``%(name)s`` marks, identifiers substituted) made ready for its dialect."""
        params = tuple(dict.fromkeys(_PARAM.findall(sql)))
        if not postgres:
            return cls(_PARAM.sub(r":\1", sql), params=params)
        number = {param: n for n, param in enumerate(params, 1)}
        prepare = _PARAM.sub(lambda m: f"${number[m.group(1)]}", sql)
        prepared_name = PREFIX + hashlib.blake2b(prepare.encode(), digest_size=16).hexdigest()
        marks = f"({', '.join(f'%({p})s' for p in params)})" if params else ""
        return cls(sql, prepared_name, prepare, f"EXECUTE {prepared_name}{marks}", params)


def text_of(name: str, dialect: str) -> str:
    found = STATEMENTS.get((name, dialect)) or STATEMENTS.get((name, None))
    if found is None:
        raise KeyError(f"no statement {name!r} for {dialect} in {PATH}")
    return found


_rendered: dict[tuple, Query] = {}


def statement(model: Model, name: str, *, order_by: Optional[str] = None, written: Sequence[str] = ()) -> Query:
    """Statement ``name`` for ``model``'s table in its database's dialect, rendered once per ``order_by``
    column and set of ``written`` columns."""
    meta = model._meta
    db = meta.database
    # The database by its class (dialect, quotes), not by id(db), which a new Database may reuse.
    key = (name, model, meta.table_name, meta.schema, type(db), order_by, tuple(written))
    found = _rendered.get(key)
    if found is None:
        found = _rendered.setdefault(key, Query.of(render(model, name, order_by, written), is_postgres(db)))
    return found


def render(model: Model, name: str, order_by: Optional[str] = None, written: Sequence[str] = (),
           rows: int = 0) -> str:
    """Statement ``name``'s text for ``model``, its identifiers substituted, its marks as written (not kept);
    ``rows``: that many rows of the ``written`` columns in the driver's positional marks."""
    meta = model._meta
    db = meta.database
    text = text_of(name, dialect_of(db))
    for column in (*written, *([order_by] if order_by else [])):
        if not _WORD.fullmatch(column):
            raise ValueError(f"statement {name}: {column!r} is not a column name")
    named = meta.table_name
    identifiers = {
        "jobs": table(db, meta.table_name, meta.schema),
        "fences": quote(db, FENCES),
        "columns": ", ".join(f"{quote(db, named)}.{quote(db, f.column_name)}" for f in meta.sorted_fields),
        "order_by": quote(db, order_by) if order_by else "",
        "fields": ", ".join(quote(db, c) for c in written),
        "values": ", ".join(f"%({c})s" for c in written),
        "assignments": ", ".join(f"{quote(db, c)} = %({c})s" for c in written),
        "rows": ", ".join([f"({', '.join([db.param] * len(written))})"] * rows),
    }
    if (set(_IDENTIFIER.findall(text)) & {"fields", "values", "assignments", "rows"}) and not written:
        raise ValueError(f"statement {name} writes the columns the call names: none were named")
    return _IDENTIFIER.sub(lambda m: identifiers[m.group(1)], text)


def fragment(model: Model, name: str, params: Mapping[str, Any]) -> pw.SQL:
    """An expression of the file (``now``, ``history_append``) for a peewee query, in peewee's own marks."""
    db = model._meta.database
    text = text_of(name, dialect_of(db))
    order = _PARAM.findall(text)
    return pw.SQL(_PARAM.sub(lambda _: db.param, text), [params[p] for p in order])


def run(model: Model, name: str, params: Mapping[str, Any], *, prepare: bool = True, **identifiers: Any) -> Any:
    """Statement ``name`` on ``model``'s table with ``params``; returns the cursor.  ``prepare=False``: see
    :func:`unprepared`."""
    query = statement(model, name, **identifiers)
    db = model._meta.database
    return execute(db, query, params) if prepare else unprepared(db, query.sql, params)


#: Set on a peewee Database whose statements are prepared (psycopg2, and Django's cursors).
_ON = "_dramatiq_unique_prepares"

_unpreparable: set[str] = set()
#: Per connection (each thread has its own): the names prepared on it (a new connection starts empty).
_prepared: "weakref.WeakKeyDictionary[Any, set[str]]" = weakref.WeakKeyDictionary()


def enable(db: pw.Database, on: bool) -> None:
    """Whether :func:`execute` prepares ``db``'s statements (psycopg2 only: psycopg 3 prepares by itself)."""
    setattr(db, _ON, on and is_postgres(db) and not is_psycopg3(db))


def execute(db: pw.Database, query: Query, params: Mapping[str, Any]) -> Any:
    """``query`` on ``db`` with ``params``, as a prepared statement where it can be; returns the cursor."""
    name = query.prepared_name
    if not getattr(db, _ON, False) or name in _unpreparable:
        return db.execute_sql(query.sql, params)
    conn = db.connection()
    if name not in _prepared.get(conn, ()) and (db.in_transaction() or not _prepare(db, query)):
        return db.execute_sql(query.sql, params)  # a failed PREPARE would abort the caller's transaction
    try:
        return db.execute_sql(query.execute_sql, params)
    except pw.DatabaseError as e:
        if "prepared statement" not in str(e):
            raise
        same = db.connection() is conn  # else the database reconnected: a new connection, without it
        if same:
            # Gone from the client connection it was prepared on: its statements meet other server
            # connections, as only a pooler in transaction mode lends them (one that setup() could not
            # probe: a framework's connection, another pooler). Prepare nothing more on this database.
            setattr(db, _ON, False)
            logger.warning("%s: a statement prepared on this connection was missing: a pooler in transaction "
                           "mode? The suite prepares nothing more there (prepared_statements=False says so "
                           "at set-up).", describe(db))
        if db.in_transaction():
            raise  # the error aborted the caller's transaction
        return db.execute_sql(query.sql if same or not _prepare(db, query) else query.execute_sql, params)


def unprepared(db: pw.Database, sql: str, params: Mapping[str, Any]) -> Any:
    """``sql`` planned for its own ``params`` each time it runs, by psycopg 3 too (which prepares a statement
    it has run a few times)."""
    if not is_psycopg3(db):
        return db.execute_sql(sql, params)
    with pw.__exception_wrapper__:  # type: ignore[attr-defined]  # what peewee's own execute_sql runs under
        cursor = db.cursor()
        cursor.execute(sql, params, prepare=False)
    return cursor


def _prepare(db: pw.Database, query: Query) -> bool:
    try:
        db.execute_sql(f"PREPARE {query.prepared_name} AS {query.prepare_sql}")
    except pw.DatabaseError as e:
        if "already exists" not in str(e):  # else the same text, by its name
            if isinstance(e, pw.ProgrammingError):  # the statement itself (not the connection): for good
                _unpreparable.add(query.prepared_name)
            return False
    # On the connection it ran on: a reconnect may have replaced the last.
    _prepared.setdefault(db.connection(), set()).add(query.prepared_name)
    return True
