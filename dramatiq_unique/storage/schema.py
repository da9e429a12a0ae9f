"""Creating a job table, and bringing one made by an earlier version up to date.

Earlier versions had no ``app`` column, and indexes that did not start
with it: ``(status, process_after)``, ``(status, lease_until)``,
``(finished_at)``, ``(parked_on)`` and unique ``unique_hold`` and
``idempotency_hold``.
Opening such a table (``setup()``, or an actor's ``job_model`` at
declaration):

1. adds ``app VARCHAR(255) NOT NULL DEFAULT ''``: a constant default, so
   neither SQLite nor PostgreSQL (11 and later) rewrites the table, and a
   process of the earlier version that still runs (a rolling upgrade)
   keeps inserting rows, with ``app = ''``;
2. creates the model's indexes, which all start with ``app``; the new
   unique ones cannot clash, the old unique ones held;
3. drops the old indexes, which the new ones replace (every write would
   otherwise keep both up to date).

Rows with ``app = ''`` are adopted by the first re-drive pass of the app
that declares their actor (durable/scope.py).  Each step is idempotent, and the
steps run in one transaction, under an advisory lock on PostgreSQL (its
``IF NOT EXISTS`` is not safe against a concurrent creation) and under
SQLite's write lock: several processes starting at once take turns.  On a large PostgreSQL
table, step 2 holds writes back while it builds the indexes (a plain
``CREATE INDEX``): create them beforehand with ``CREATE INDEX
CONCURRENTLY`` under the same names to avoid that.
"""

from __future__ import annotations

import hashlib
import logging

import peewee as pw

from dramatiq_unique.storage import queries

logger = logging.getLogger(__name__)

#: The column every row's app is kept in (queries.sql: add_app_column).
APP_COLUMN = "app"
#: Indexes of earlier versions that the app-leading ones replace: (columns, unique).
OLD_INDEXES = (
    (("status", "process_after"), False),
    (("status", "lease_until"), False),
    (("finished_at",), False),
    (("unique_hold",), True),
    (("idempotency_hold",), True),
    # Parked rows are looked up by app and group (queries.sql: queue_head): (app, parked_on, created_at) replaces it.
    (("parked_on",), False),
)


#: The PostgreSQL advisory lock that set-ups of the job tables take turns on.
LOCK_ID = int.from_bytes(hashlib.sha256(b"dramatiq_unique.storage.schema").digest()[:8], "big", signed=True)


def create_or_migrate(model: type[pw.Model]) -> None:
    """Create ``model``'s table and indexes if missing; migrate a table of an earlier version."""
    db = model._meta.database
    with db.atomic():
        if isinstance(db, pw.PostgresqlDatabase):
            db.execute_sql("SELECT pg_advisory_xact_lock(%s)", [LOCK_ID])
        _create_or_migrate(model)


def _create_or_migrate(model: type[pw.Model]) -> None:
    db = model._meta.database
    model._schema.create_table(safe=True)  # type: ignore[attr-defined]  # peewee's schema manager
    added = _add_app_column(model)
    model._schema.create_indexes(safe=True)  # type: ignore[attr-defined]
    if added:
        logger.warning("Added the column %r to %s; rows written before belong to no app until a re-drive "
                       "pass of the app that declares their actor adopts them.", APP_COLUMN, model._meta.table_name)
    wanted = {tuple(columns) for columns, _ in model._meta.indexes}
    for columns, unique in OLD_INDEXES:
        # A subclass that declares one of these indexes itself keeps it.
        if columns not in wanted and all(name in model._meta.fields for name in columns):
            name = pw.ModelIndex(model, [model._meta.fields[c] for c in columns], unique=unique)._name  # type: ignore[attr-defined]  # peewee's index name
            db.execute_sql(f"DROP INDEX IF EXISTS {queries.table(db, name, model._meta.schema)}")  # names vary


def _add_app_column(model: type[pw.Model]) -> bool:
    """Add the ``app`` column if the table lacks it; whether this call added it."""
    db = model._meta.database
    if APP_COLUMN in _columns(model):
        return False
    # Under the lock of create_or_migrate: nobody adds it meanwhile.
    db.execute_sql(queries.text(model, "add_app_column"))
    return True


def _columns(model: type[pw.Model]) -> set[str]:
    """The table's column names, in the schema the connection resolves it in (PostgreSQL's search_path)."""
    db = model._meta.database
    if isinstance(db, pw.PostgresqlDatabase):
        meta = model._meta
        statement = queries.render(model, "table_columns", schema="named_schema" if meta.schema else "current_schema")
        cursor = db.execute_sql(statement.sql, statement.params({"table": meta.table_name, "schema": meta.schema}))
        return {name for (name,) in cursor.fetchall()}
    return {column.name for column in db.get_columns(model._meta.table_name, model._meta.schema)}

