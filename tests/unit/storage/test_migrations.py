"""Versions read from a table's columns, the plan and the lock, on SQLite (embedded, no service)."""

from __future__ import annotations

import peewee as pw
import pytest

from dramatiq_unique.errors import SchemaOutOfDate
from dramatiq_unique.health.target import bound
from dramatiq_unique.storage import migrations, schema
from dramatiq_unique.storage.models import JobModel


@pytest.fixture
def db(tmp_path):
    db = pw.SqliteDatabase(str(tmp_path / "jobs.db"))
    yield db
    db.close()


def test_versions_from_columns():
    assert schema.inferred({"id", "status"}) == 0
    assert schema.inferred({"id", "app"}) == 1
    assert schema.inferred({"id", "app", "history"}) == 2
    assert schema.inferred({"id", "app", "history", "parked_at", "parked_attempt"}) == 3
    assert max(migrations.MIGRATIONS) == schema.CURRENT_VERSION


def test_a_missing_table_is_created_at_the_current_version(db):
    model = bound(JobModel, db, 0)
    assert schema.version_of(model) is None
    assert migrations.status(model).pending  # "create the table"
    schema.create_or_migrate(model)
    assert schema.recorded(model) == schema.CURRENT_VERSION
    status = migrations.status(model)
    assert status.current and status.pending == []
    assert migrations.migrate(model).applied == []  # nothing to do
    schema.create_or_migrate(model)  # opening again: unchanged


def test_an_older_table_is_refused_unless_tolerated(db):
    model = bound(JobModel, db, 0)
    schema.create_or_migrate(model)
    db.execute_sql('ALTER TABLE "dramatiq_unique_jobs" DROP COLUMN "history"')
    db.execute_sql('DELETE FROM "dramatiq_unique_schema"')  # as a release before versions left it
    assert schema.version_of(model) == 1
    with pytest.raises(SchemaOutOfDate, match="migrate"):
        schema.create_or_migrate(model)
    with schema.tolerating_old():
        schema.create_or_migrate(model)
    planned = migrations.migrate(model, dry_run=True)
    assert planned.version == 1 and len(planned.pending) == 3 and "history" in planned.pending[0]
    assert "partial" in planned.pending[1] and "unique holds" in planned.pending[2]
    assert schema.version_of(model) == 1
    done = migrations.migrate(model)
    assert done.version == schema.CURRENT_VERSION and done.applied == planned.pending
    assert schema.recorded(model) == schema.CURRENT_VERSION


def test_a_table_of_version_2_gets_the_parked_columns(db):
    model = bound(JobModel, db, 0)
    schema.create_or_migrate(model)
    for column in ("parked_at", "parked_attempt"):
        db.execute_sql(f'ALTER TABLE "dramatiq_unique_jobs" DROP COLUMN "{column}"')
    db.execute_sql('DELETE FROM "dramatiq_unique_schema"')
    assert schema.version_of(model) == 2
    planned = migrations.migrate(model, dry_run=True)
    assert [step.split(": ", 1)[1].split()[:3] for step in planned.pending] == [
        ["add", "column", "parked_at"], ["add", "column", "parked_attempt"], ["create", "the", "partial"],
        ["create", "the", "partial"]]
    assert migrations.migrate(model).version == 5
    assert {"parked_at", "parked_attempt"} <= schema.columns(model) and schema.recorded(model) == 5


def test_a_table_of_version_3_gets_partial_indexes(db):
    """Its whole indexes of the names the model makes partial are made again with their WHERE, the
    unique ones keep their guarantee, the running rows' index goes (the open rows' one serves them), and
    the job table's other indexes stay as they are, a partial one made beforehand (CONCURRENTLY) too."""
    model = bound(JobModel, db, 0)
    schema.create_or_migrate(model)
    for index in model._meta.fields_to_index():
        if index._name == "jobmodel_app_finished_at":
            continue  # made partial beforehand
        db.execute_sql(f'DROP INDEX "{index._name}"')
        if index._name == "jobmodel_app_actor_name":
            continue  # version 5's
        name = index._name.removesuffix("_partial")  # the holds' index: whole, of its columns' name, until version 5
        db.execute_sql(f'CREATE {"UNIQUE " if index._unique else ""}INDEX "{name}" ON "dramatiq_unique_jobs" '
                       f'({", ".join(chr(34) + f.column_name + chr(34) for f in index._expressions)})')
    db.execute_sql('CREATE INDEX "mine" ON "dramatiq_unique_jobs" ("queue_name")')
    db.execute_sql('CREATE INDEX "jobmodel_app_status_lease_until" ON "dramatiq_unique_jobs" '
                   '("app", "status", "lease_until")')
    with schema.locked(db):
        schema.record(model, 3)
    planned = migrations.migrate(model, dry_run=True).pending
    # 3 whole ones dropped (SQLite keeps the status ones whole) and the running rows' one, the partial ones
    # made (version 4), the holds' partial one made beside the whole one (version 5)
    assert len(planned) == 6 and not any("jobmodel_app_finished_at" in step for step in planned)
    done = migrations.migrate(model)
    assert done.version == 5 and done.contract == [
        "drop index jobmodel_app_unique_hold (replaced by a partial one; no process of an earlier release may run)"]

    def definitions() -> dict:
        rows = db.execute_sql("SELECT name, sql FROM sqlite_master WHERE type = 'index' AND sql IS NOT NULL")
        return dict(rows.fetchall())

    partial = {name for name, sql in definitions().items() if " WHERE " in sql}
    assert partial == {index._name for index in model._meta.fields_to_index() if index._where is not None}
    assert len(partial) == 6 and "mine" in definitions() and "jobmodel_app_unique_hold" not in partial
    assert "jobmodel_app_unique_hold" in definitions()  # until the contract
    assert "jobmodel_app_status_lease_until" not in definitions()
    contracted = migrations.migrate(model, contract=True)
    assert contracted.applied == done.contract and contracted.contract == []
    assert "jobmodel_app_unique_hold" not in definitions() and migrations.migrate(model, contract=True).applied == []
    insert = 'INSERT INTO "dramatiq_unique_jobs" (app, message_id, actor_name, queue_name, args, kwargs, options, ' \
        'status, attempts, revision, created_at, fencing_token, unique_hold, idempotency_hold) ' \
        "VALUES ('a', ?, 'x', 'q', '[]', '{}', '{}', 'queued', 0, 0, '2026-01-01', 0, ?, ?)"
    db.execute_sql(insert, ["m1", "k", "i"])
    for message_id, hold, idempotency in (("m2", "k", None), ("m3", None, "i")):
        with pytest.raises(pw.IntegrityError):
            db.execute_sql(insert, [message_id, hold, idempotency])


def test_a_newer_table_is_accepted(db):
    model = bound(JobModel, db, 0)
    schema.create_or_migrate(model)
    with schema.locked(db):
        schema.record(model, schema.CURRENT_VERSION + 1)
    schema.create_or_migrate(model)
    assert migrations.status(model).current
