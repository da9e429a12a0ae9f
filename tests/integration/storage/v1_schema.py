"""The job table as the release before schema versions made it (version 1), frozen: the DDL that
main's ``JobModel`` produced on 2026-11-24 (peewee's ``_create_table`` and ``_create_indexes``),
for upgrade tests.  ``extra`` adds a user's ``job_model`` columns and indexes."""

from __future__ import annotations

import uuid
from typing import Any, Optional

from dramatiq_unique.storage.database import is_postgres
from dramatiq_unique.storage.models import utcnow

_COLUMNS = (
    '"app" VARCHAR(255) NOT NULL DEFAULT \'\', "message_id" VARCHAR(64) NOT NULL, '
    '"actor_name" VARCHAR(255) NOT NULL, "queue_name" VARCHAR(255) NOT NULL, "args" TEXT NOT NULL, '
    '"kwargs" TEXT NOT NULL, "options" TEXT NOT NULL, "unique_key" VARCHAR(300), "unique_hold" VARCHAR(300), '
    '"status" VARCHAR(16) NOT NULL, "attempts" INTEGER NOT NULL, "revision" INTEGER NOT NULL, '
    '"created_at" {ts} NOT NULL, "enqueued_at" {ts}, "process_after" {ts}, "started_at" {ts}, '
    '"finished_at" {ts}, "lease_until" {ts}, "last_error" TEXT, "result" TEXT, "idempotency_key" VARCHAR(255), '
    '"owner" VARCHAR(255), "idempotency_hold" VARCHAR(300), "fencing_token" {big} NOT NULL, "checkpoints" TEXT, '
    '"worker" VARCHAR(255), "parked_on" VARCHAR(300), "broker_ref" VARCHAR(64), "checked_at" {ts}, '
    '"missing_since" {ts}'
)
#: name suffix: (unique, columns)
INDEXES = {
    "message_id": (True, ("message_id",)),
    "unique_key": (False, ("unique_key",)),
    "app_status_process_after": (False, ("app", "status", "process_after")),
    "app_status_lease_until": (False, ("app", "status", "lease_until")),
    "app_finished_at": (False, ("app", "finished_at")),
    "app_unique_hold": (True, ("app", "unique_hold")),
    "app_idempotency_hold": (True, ("app", "idempotency_hold")),
    "app_parked_on_created_at": (False, ("app", "parked_on", "created_at")),
}


def create_v1_table(db, table: str = "dramatiq_unique_jobs", prefix: str = "jobmodel",
                    extra: Optional[dict[str, str]] = None, extra_indexes: tuple[str, ...] = ()) -> None:
    pg = is_postgres(db)
    primary = '"id" BIGSERIAL NOT NULL PRIMARY KEY' if pg else '"id" INTEGER NOT NULL PRIMARY KEY'
    columns = _COLUMNS.format(ts="TIMESTAMP" if pg else "DATETIME", big="BIGINT" if pg else "INTEGER")
    more = "".join(f', "{name}" {kind}' for name, kind in (extra or {}).items())
    db.execute_sql(f'CREATE TABLE "{table}" ({primary}, {columns}{more})')
    for suffix, (unique, cols) in INDEXES.items():
        kind = "UNIQUE INDEX" if unique else "INDEX"
        quoted = ", ".join(f'"{c}"' for c in cols)
        db.execute_sql(f'CREATE {kind} "{prefix}_{suffix}" ON "{table}" ({quoted})')
    for column in extra_indexes:
        db.execute_sql(f'CREATE INDEX "{prefix}_{column}" ON "{table}" ("{column}")')


def insert_v1(db, *, app: str, actor_name: str, status: str = "succeeded", table: str = "dramatiq_unique_jobs",
              **extra: Any) -> str:
    """A row as version 1 wrote it."""
    message_id = str(uuid.uuid4())
    values = {"app": app, "message_id": message_id, "actor_name": actor_name, "queue_name": "default",
              "args": "[1]", "kwargs": "{}", "options": "{}", "status": status, "attempts": 1, "revision": 0,
              "created_at": utcnow(), "fencing_token": 0, "last_error": "ValueError: old", **extra}
    names = ", ".join(f'"{name}"' for name in values)
    db.execute_sql(f'INSERT INTO "{table}" ({names}) VALUES ({", ".join([db.param] * len(values))})',
                   list(values.values()))
    return message_id


def index_names(db, table: str = "dramatiq_unique_jobs") -> set[str]:
    return set(index_definitions(db, table))


def index_definitions(db, table: str = "dramatiq_unique_jobs") -> dict[str, str]:
    """Each index of ``table`` by name: its CREATE INDEX statement (none for SQLite's own)."""
    if is_postgres(db):
        sql = "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = %s AND schemaname = current_schema()"
    else:
        sql = "SELECT name, sql FROM sqlite_master WHERE type = 'index' AND tbl_name = ?"
    return {name: definition or "" for (name, definition) in db.execute_sql(sql, [table]).fetchall()}
