"""Schema versions: which version a table of the suite is at, and opening one at set-up (created at the
current version, refused if older, given its missing indexes if current: docs/operations/migrations.md)."""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import logging
from typing import Iterator, Optional

import peewee as pw

from dramatiq_unique.errors import SchemaOutOfDate
from dramatiq_unique.storage import queries
from dramatiq_unique.storage.models import utcnow

logger = logging.getLogger(__name__)

#: The schema version this release writes and reads (storage/migrations.py lists how to reach it).
CURRENT_VERSION = 5
#: The table that records each job table's version, in every store.
VERSIONS_TABLE = "dramatiq_unique_schema"
#: The columns each version added to the job tables (versions 4 and 5 made indexes partial).
COLUMNS = {1: ("app",), 2: ("history",), 3: ("parked_at", "parked_attempt")}
#: What the refusal tells the operator to run.
COMMAND = "python -m dramatiq_unique migrate APP (or: dramatiq-unique migrate APP)"

#: The PostgreSQL advisory lock that set-ups and migrations of the job tables take turns on.
LOCK_ID = int.from_bytes(hashlib.sha256(b"dramatiq_unique.storage.schema").digest()[:8], "big", signed=True)


class VersionModel(pw.Model):
    """A job table's schema version, in the store that holds it."""

    table = pw.CharField(max_length=300, primary_key=True)
    version = pw.IntegerField()
    migrated_at = pw.DateTimeField(null=True)

    class Meta:
        table_name = VERSIONS_TABLE


_tolerant = contextvars.ContextVar("dramatiq_unique_tolerant", default=False)


@contextlib.contextmanager
def tolerating_old() -> Iterator[None]:
    """Within it, set-up opens a table of an older version instead of refusing it: ``migrate`` imports
    the app, whose ``setup()`` must get as far as naming its tables."""
    token = _tolerant.set(True)
    try:
        yield
    finally:
        _tolerant.reset(token)


@contextlib.contextmanager
def locked(db: pw.Database) -> Iterator[None]:
    """A transaction in which no other set-up or migration of ``db`` runs."""
    immediate = isinstance(db, pw.SqliteDatabase) and not db.in_transaction()  # SQLite's write lock at BEGIN
    with db.atomic(lock_type="IMMEDIATE") if immediate else db.atomic():
        if isinstance(db, pw.PostgresqlDatabase):
            db.execute_sql("SELECT pg_advisory_xact_lock(%s)", [LOCK_ID])
        yield


def table_key(model: type[pw.Model]) -> str:
    meta = model._meta
    return f"{meta.schema}.{meta.table_name}" if meta.schema else meta.table_name


def where(model: type[pw.Model]) -> Optional[str]:
    """The schema ``model``'s table is in (queries.sql's ``current_schema``)."""
    return queries.run(model, "current_schema", {"schema": model._meta.schema}).fetchone()[0]


def columns(model: type[pw.Model]) -> set[str]:
    """The table's column names (none: no table)."""
    return {column.name for column in model._meta.database.get_columns(model._meta.table_name, where(model))}


def target_version(model: type[pw.Model]) -> int:
    return int(getattr(model, "dramatiq_unique_version", CURRENT_VERSION))


def is_job_table(model: type[pw.Model]) -> bool:
    return not hasattr(model, "dramatiq_unique_version")


def inferred(names: set[str], model: Optional[type[pw.Model]] = None) -> int:
    """The version of a table that recorded none, from its columns (another table than a job table: 1)."""
    if model is not None and not is_job_table(model):
        return 1
    version = 0
    while version + 1 in COLUMNS and COLUMNS[version + 1][0] in names:
        version += 1
    return version


def recorded(model: type[pw.Model]) -> Optional[int]:
    """The version recorded for ``model``'s table in its store, if any."""
    if queries.run(model, "versions_table", {}).fetchone() is None:
        return None
    with model._meta.database.bind_ctx([VersionModel], bind_refs=False, bind_backrefs=False):
        row = VersionModel.get_or_none(VersionModel.table == table_key(model))
    return None if row is None else int(row.version)


def version_of(model: type[pw.Model]) -> Optional[int]:
    """``model``'s table's version: None if the table does not exist."""
    names = columns(model)
    if not names:
        return None
    found = recorded(model)
    return inferred(names, model) if found is None else found


def record(model: type[pw.Model], version: int) -> None:
    """Record ``model``'s table at ``version`` (inside the caller's :func:`locked` transaction)."""
    db = model._meta.database
    with db.bind_ctx([VersionModel], bind_refs=False, bind_backrefs=False):
        db.create_tables([VersionModel], safe=True)
        VersionModel.insert(table=table_key(model), version=version, migrated_at=utcnow()).on_conflict(
            conflict_target=[VersionModel.table], update={VersionModel.version: version,
                                                          VersionModel.migrated_at: utcnow()},
        ).execute()


def out_of_date(model: type[pw.Model], version: int) -> SchemaOutOfDate:
    kind = "job table" if is_job_table(model) else "table"
    return SchemaOutOfDate(
        f"the {kind} {table_key(model)} in {model._meta.database.database!r} is at schema version {version}, "
        f"this release needs version {target_version(model)}: run {COMMAND} (migrations are additive: workers of the "
        f"earlier release may keep running meanwhile)"
    )


def create_or_migrate(model: type[pw.Model]) -> None:
    """Open ``model``'s table: create it at the current version if missing, refuse it if older (unless
    :func:`tolerating_old`), add the indexes it lacks if current."""
    db = model._meta.database
    target = target_version(model)
    with locked(db):
        version = version_of(model)
        if version is None:
            model._schema.create_all(safe=True)  # type: ignore[attr-defined]  # peewee's schema manager: with indexes
            record(model, target)
        elif version < target:
            if not _tolerant.get():
                raise out_of_date(model, version)
            logger.info("%s is at schema version %d of %d; to be migrated.", table_key(model), version, target)
        else:
            model._schema.create_indexes(safe=True)  # type: ignore[attr-defined]
            if recorded(model) is None:
                record(model, version)
