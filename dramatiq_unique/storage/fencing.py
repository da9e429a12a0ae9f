"""Fencing tokens: one counter per unique key, kept in the job database.

Every execution-lock acquisition of a key draws the key's next token,
and the attempt's row carries it (``fencing_token``).  The suite's
writes of an outcome are conditional on the row still carrying the
attempt's token, and drawing a token takes the rows of the same key
that still run under an older one off their attempts (their token is
advanced), so a worker that stalled past its lease can record nothing
over, or beside, the attempt that replaced it.

Why the database and not Redis: the tokens guard database writes, so
the database is their natural authority.  A Redis counter would start
again from zero after a flush or a fail-over, and a newer holder could
then get a smaller token than a zombie still holds; a counter in the
job database survives whatever happens to Redis.  ``INSERT ... ON
CONFLICT DO UPDATE ... RETURNING`` makes each draw one statement on
SQLite (3.35 and later) and PostgreSQL.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Callable, Optional

import peewee as pw

from dramatiq_unique.storage.models import JobStatus, is_postgres

if TYPE_CHECKING:
    from dramatiq_unique.storage.models import JobModel

TABLE = "dramatiq_unique_fences"


class FenceModel(pw.Model):
    """The newest fencing token handed out for each key."""

    key = pw.CharField(max_length=300, primary_key=True)
    token = pw.BigIntegerField(default=0)

    class Meta:
        table_name = TABLE


def create_table(db: pw.Database) -> None:
    with db.bind_ctx([FenceModel], bind_refs=False, bind_backrefs=False):
        db.create_tables([FenceModel], safe=True)


_statements: dict[tuple, tuple[str, Optional[str]]] = {}
_statements_lock = threading.Lock()


def _parts(model: type["JobModel"]) -> tuple[Callable[[str], str], str, str, str]:
    """The quoting function, parameter mark, quoted job table, and the draw statement
    (``INSERT ... ON CONFLICT DO UPDATE ... RETURNING token``; parameter: the key)."""
    db = model._meta.database
    left, right = db.quote
    q = lambda name: f"{left}{name}{right}"  # noqa: E731
    p = db.param
    meta = model._meta
    jobs = q(meta.table_name) if not meta.schema else f"{q(meta.schema)}.{q(meta.table_name)}"
    draw = (
        f"INSERT INTO {q(TABLE)} ({q('key')}, {q('token')}) VALUES ({p}, 1) "
        f"ON CONFLICT ({q('key')}) DO UPDATE SET {q('token')} = {q(TABLE)}.{q('token')} + 1 "
        f"RETURNING {q('token')}"
    )
    return q, p, jobs, draw


def _sql(model: type["JobModel"]) -> tuple[str, Optional[str]]:
    """The statements of a draw for ``model``'s table, built once per dialect.

    PostgreSQL: one statement (the revocation in a data-modifying CTE).
    SQLite: the draw, then the revocation.
    """
    db = model._meta.database
    # Keyed by what the text depends on (not by id(db), which a new database may reuse).
    cache_key = (model._meta.table_name, model._meta.schema, db.param, tuple(db.quote), is_postgres(db))
    found = _statements.get(cache_key)
    if found is not None:
        return found
    q, p, jobs, draw = _parts(model)
    token = f"(SELECT {q('token')} FROM drawn)" if is_postgres(db) else p
    # Rows of the key still running under an older token lose their attempt;
    # the drawing job's own row stops being parked (it runs now).
    revoke = (
        f"UPDATE {jobs} SET "
        f"{q('fencing_token')} = CASE WHEN {q('id')} = {p} THEN {q('fencing_token')} ELSE {token} END, "
        f"{q('parked_on')} = CASE WHEN {q('id')} = {p} THEN NULL ELSE {q('parked_on')} END "
        f"WHERE {q('unique_key')} = {p} AND ("
        f"({q('status')} = {p} AND {q('fencing_token')} < {token} AND {q('id')} <> {p}) "
        f"OR ({q('id')} = {p} AND {q('parked_on')} IS NOT NULL)) "
        # Only rows of the drawing job's app: another app's job of the same key is not ours to fence.
        f"AND {q('app')} = COALESCE((SELECT me.{q('app')} FROM {jobs} AS me WHERE me.{q('id')} = {p}), {q('app')})"
    )
    statements: tuple[str, Optional[str]]
    if is_postgres(db):
        statements = (f"WITH drawn AS ({draw}), revoked AS ({revoke}) SELECT {q('token')} FROM drawn", None)
    else:
        statements = (draw, revoke)
    with _statements_lock:
        _statements[cache_key] = statements
    return statements


def start_clauses(model: type["JobModel"]) -> tuple[str, str]:
    """PostgreSQL CTE bodies for :func:`dramatiq_unique.storage.statements.start`: ``drawn`` (the draw;
    parameter: key) and ``revoked`` (older running attempts of the key fenced out;
    parameters: key, the starting job's id).  The starting row itself is left
    to the main statement: PostgreSQL does not update one row twice in a statement."""
    q, p, jobs, draw = _parts(model)
    token = f"(SELECT {q('token')} FROM drawn)"
    # Joined to the starting row ("me") to keep to its app's rows (another app's job of the
    # same key is not ours to fence) without another parameter.
    revoke = (
        f"UPDATE {jobs} SET {q('fencing_token')} = {token} FROM {jobs} AS me "
        f"WHERE {jobs}.{q('unique_key')} = {p} AND {jobs}.{q('status')} = '{JobStatus.RUNNING.value}' "
        f"AND {jobs}.{q('fencing_token')} < {token} AND me.{q('id')} = {p} AND {jobs}.{q('id')} <> me.{q('id')} "
        f"AND {jobs}.{q('app')} = me.{q('app')}"
    )
    return draw, revoke


def draw(model: type["JobModel"], key: str, job_id: Optional[int] = None) -> int:
    """The key's next token, for job ``job_id`` about to run.

    Rows of the key still running under an older token are fenced out:
    their attempts lost the lock, and can record nothing any more.  No
    transaction is needed around the two steps on SQLite: a draw that
    is not followed by its revocation (a crash, an error) runs no job,
    and the next draw of the key revokes the same rows.
    """
    db = model._meta.database
    first, then = _sql(model)
    own = -1 if job_id is None else int(job_id)
    running = JobStatus.RUNNING.value
    if then is None:
        return int(db.execute_sql(first, [key, own, own, key, running, own, own, own]).fetchone()[0])
    token = int(db.execute_sql(first, [key]).fetchone()[0])
    db.execute_sql(then, [own, token, own, key, running, token, own, own, own])
    return token


def current(db: pw.Database, key: str) -> int:
    """The newest token handed out for ``key`` (0 if none): for inspection and tests."""
    left, right = db.quote
    row = db.execute_sql(
        f"SELECT {left}token{right} FROM {left}{TABLE}{right} WHERE {left}key{right} = {db.param}", [key]
    ).fetchone()
    return 0 if row is None else int(row[0])
