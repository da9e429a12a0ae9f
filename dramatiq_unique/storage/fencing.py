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

from typing import TYPE_CHECKING, Optional

import peewee as pw

from dramatiq_unique.storage import queries
from dramatiq_unique.storage.database import is_postgres
from dramatiq_unique.storage.models import JobStatus

if TYPE_CHECKING:
    from dramatiq_unique.storage.models import JobModel

TABLE = queries.FENCES


class FenceModel(pw.Model):
    """The newest fencing token handed out for each key."""

    key = pw.CharField(max_length=300, primary_key=True)
    token = pw.BigIntegerField(default=0)

    class Meta:
        table_name = TABLE


def create_table(db: pw.Database) -> None:
    with db.bind_ctx([FenceModel], bind_refs=False, bind_backrefs=False):
        db.create_tables([FenceModel], safe=True)


def draw(model: type["JobModel"], key: str, job_id: Optional[int] = None) -> int:
    """The key's next token, for job ``job_id`` about to run.

    Rows of the key still running under an older token are fenced out:
    their attempts lost the lock, and can record nothing any more.  On
    PostgreSQL the two steps are one statement (the revocation in a
    data-modifying CTE).  No transaction is needed around them on SQLite:
    a draw that is not followed by its revocation (a crash, an error) runs
    no job, and the next draw of the key revokes the same rows.
    """
    values = {"key": key, "own": -1 if job_id is None else int(job_id), "running": JobStatus.RUNNING.value}
    if is_postgres(model._meta.database):
        return int(queries.run(model, "draw_and_revoke", values).fetchone()[0])
    values["token"] = token = int(queries.run(model, "draw_token", values).fetchone()[0])
    queries.run(model, "revoke_older", values)
    return token


def current(db: pw.Database, key: str) -> int:
    """The newest token handed out for ``key`` (0 if none): for inspection and tests."""
    row = queries.execute(db, queries.on(db, "current_token"), {"key": key}).fetchone()
    return 0 if row is None else int(row[0])
