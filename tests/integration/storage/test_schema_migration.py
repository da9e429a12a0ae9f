"""A job table of an earlier version (no ``app`` column: schema version 0) refused by setup() and brought up
to date by `migrate` (storage/migrations.py), on SQLite and PostgreSQL."""

from __future__ import annotations

import uuid

import dramatiq
import pytest
from dramatiq.brokers.redis import RedisBroker

import dramatiq_unique
from dramatiq_unique import JobModel
from dramatiq_unique.durable.redrive import redrive
from dramatiq_unique.health.target import bound
from dramatiq_unique.storage import migrations, schema
from dramatiq_unique.storage.database import is_postgres, open_database
from dramatiq_unique.storage.models import utcnow
from tests.conftest import REDIS_URL
from tests.durable import broker_messages

# The table as the version before the app column created it (peewee's DDL of that JobModel).
_COLUMNS = (
    '"message_id" VARCHAR(64) NOT NULL, "actor_name" VARCHAR(255) NOT NULL, "queue_name" VARCHAR(255) NOT NULL, '
    '"args" TEXT NOT NULL, "kwargs" TEXT NOT NULL, "options" TEXT NOT NULL, "unique_key" VARCHAR(300), '
    '"unique_hold" VARCHAR(300), "status" VARCHAR(16) NOT NULL, "attempts" INTEGER NOT NULL, '
    '"revision" INTEGER NOT NULL, "created_at" {ts} NOT NULL, "enqueued_at" {ts}, "process_after" {ts}, '
    '"started_at" {ts}, "finished_at" {ts}, "lease_until" {ts}, "last_error" TEXT, "result" TEXT, '
    '"idempotency_key" VARCHAR(255), "owner" VARCHAR(255), "idempotency_hold" VARCHAR(300), '
    '"fencing_token" {big} NOT NULL, "checkpoints" TEXT, "worker" VARCHAR(255), "parked_on" VARCHAR(300), '
    '"broker_ref" VARCHAR(64), "checked_at" {ts}, "missing_since" {ts}'
)
LEGACY_INDEXES = {
    "jobmodel_message_id": (True, ("message_id",)),
    "jobmodel_unique_key": (False, ("unique_key",)),
    "jobmodel_unique_hold": (True, ("unique_hold",)),
    "jobmodel_idempotency_hold": (True, ("idempotency_hold",)),
    "jobmodel_parked_on": (False, ("parked_on",)),
    "jobmodel_status_process_after": (False, ("status", "process_after")),
    "jobmodel_status_lease_until": (False, ("status", "lease_until")),
    "jobmodel_finished_at": (False, ("finished_at",)),
}
REPLACED = {"jobmodel_unique_hold", "jobmodel_idempotency_hold", "jobmodel_status_process_after",
            "jobmodel_status_lease_until", "jobmodel_finished_at", "jobmodel_parked_on"}


def create_legacy_table(db) -> None:
    pg = is_postgres(db)
    primary = '"id" BIGSERIAL NOT NULL PRIMARY KEY' if pg else '"id" INTEGER NOT NULL PRIMARY KEY'
    columns = _COLUMNS.format(ts="TIMESTAMP" if pg else "DATETIME", big="BIGINT" if pg else "INTEGER")
    db.execute_sql(f'CREATE TABLE "dramatiq_unique_jobs" ({primary}, {columns})')
    for name, (unique, cols) in LEGACY_INDEXES.items():
        kind = "UNIQUE INDEX" if unique else "INDEX"
        columns = ", ".join(f'"{c}"' for c in cols)
        db.execute_sql(f'CREATE {kind} "{name}" ON "dramatiq_unique_jobs" ({columns})')


def insert_legacy(db, actor_name: str, status: str = "pending", hold: str | None = None) -> str:
    """A row as the earlier version wrote it: no app column in the INSERT."""
    message_id = str(uuid.uuid4())
    now = utcnow()
    db.execute_sql(
        'INSERT INTO "dramatiq_unique_jobs" ("message_id", "actor_name", "queue_name", "args", "kwargs", "options", '
        '"unique_key", "unique_hold", "status", "attempts", "revision", "created_at", "process_after", '
        '"fencing_token") '
        f"VALUES ({', '.join([db.param] * 14)})",
        [message_id, actor_name, "default", "[1]", "{}", "{}", hold, hold, status, 0, 0, now, now, 0],
    )
    return message_id


def index_names(db) -> set[str]:
    if is_postgres(db):
        sql = "SELECT indexname FROM pg_indexes WHERE tablename = %s AND schemaname = current_schema()"
    else:
        sql = "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = ?"
    return {name for (name,) in db.execute_sql(sql, ["dramatiq_unique_jobs"]).fetchall()}


@pytest.fixture
def legacy_db(database_url):
    db = open_database(database_url)
    create_legacy_table(db)
    yield db
    db.close()


def test_migrate_upgrades_a_table_of_the_earlier_version(legacy_db, database_url, key_prefix):
    """Given a table without the app column, holding jobs: setup() refuses it; migrate adds the column
    and the app-leading indexes and drops the ones they replace; a process of the earlier version
    can still insert; the first pass adopts (and sends) the rows of the actors it
    declares, and leaves the others to the app that declares them."""
    db = legacy_db
    due = insert_legacy(db, "job")
    held = insert_legacy(db, "job", status="queued", hold="job:abc")
    foreign = insert_legacy(db, "not_ours")
    broker = RedisBroker(url=REDIS_URL, namespace=f"{key_prefix}-broker")
    with pytest.raises(dramatiq_unique.SchemaOutOfDate, match="version 0"):
        dramatiq_unique.setup(broker, database=database_url, redis=REDIS_URL, key_prefix=key_prefix, redriver=False)
    assert migrations.migrate(bound(JobModel, db, 0)).version == schema.CURRENT_VERSION
    suite = dramatiq_unique.setup(broker, database=database_url, redis=REDIS_URL, key_prefix=key_prefix, redriver=False)
    try:
        dramatiq.actor(lambda n: n, broker=broker, actor_name="job", track=True)
        suite.db.execute_sql('SELECT "app" FROM "dramatiq_unique_jobs"')  # the column is there
        names = index_names(suite.db)
        assert not names & REPLACED, names
        assert {"jobmodel_app_status_process_after", "jobmodel_app_unique_hold_partial",
                "jobmodel_app_idempotency_hold", "jobmodel_app_status_finished_at", "jobmodel_app_finished_at",
                "jobmodel_app_parked_on_created_at"} <= names
        # A process of the earlier version, still running during the upgrade, can still insert.
        late = insert_legacy(db, "job")
        assert {JobModel.get(message_id=m).app for m in (due, held, foreign, late)} == {""}
        assert dramatiq_unique.get_job(due) is not None  # rows of no app yet are visible

        counts = redrive(broker, suite=suite)
        assert counts.adopted == 3 and counts.sent == 2
        assert {JobModel.get(message_id=m).app for m in (due, held, late)} == {suite.app}
        assert JobModel.get(message_id=foreign).app == ""
        assert JobModel.get(message_id=foreign).status == "pending"
        assert sorted(m["message_id"] for m in broker_messages(broker)) == sorted([due, late])

        # Setting up again (another process, a restart) changes nothing.
        again = dramatiq_unique.setup(broker, database=database_url, redis=REDIS_URL, key_prefix=key_prefix,
                                      redriver=False)
        assert index_names(again.db) == names
        again.db.close()
    finally:
        broker.flush_all()
        broker.close()
        suite.db.close()


def test_an_idempotency_key_of_the_earlier_version_returns_its_job(legacy_db, database_url, key_prefix):
    """A client retrying across the upgrade gets the job the earlier version made, before
    any pass adopted it."""
    from dramatiq_unique.unique.keys import idempotency_hold

    message_id = insert_legacy(legacy_db, "job", status="queued")
    migrations.migrate(bound(JobModel, legacy_db, 0))
    hold = idempotency_hold("job", "alice", "req-1")
    legacy_db.execute_sql(
        f'UPDATE "dramatiq_unique_jobs" SET "idempotency_key" = {legacy_db.param}, "owner" = {legacy_db.param}, '
        f'"idempotency_hold" = {legacy_db.param} '
        f'WHERE "message_id" = {legacy_db.param}',
        ["req-1", "alice", hold, message_id],
    )
    broker = RedisBroker(url=REDIS_URL, namespace=f"{key_prefix}-broker")
    suite = dramatiq_unique.setup(broker, database=database_url, redis=REDIS_URL, key_prefix=key_prefix, redriver=False)
    try:
        job = dramatiq.actor(lambda n: n, broker=broker, actor_name="job", track=True)
        found, created = dramatiq_unique.submit(job, 1, idempotency_key="req-1", owner="alice")
        assert (found.message_id, created) == (message_id, False)
        assert broker_messages(broker) == []
    finally:
        broker.flush_all()
        broker.close()
        suite.db.close()
