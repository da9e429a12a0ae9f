"""Schema versions on SQLite and PostgreSQL: a table of the current release (version 1) with rows,
refused by setup(), upgraded by `migrate` (rows kept, history works, a job runs), `status`, a user's
job_model with extra columns and indexes, two migrations at once, an interrupted one, a store down."""

from __future__ import annotations

import json
import subprocess
import sys

import dramatiq
import peewee as pw
import pytest

import dramatiq_unique
from dramatiq_unique import JobModel, SchemaOutOfDate
from dramatiq_unique.cli import main
from dramatiq_unique.health.target import bound
from dramatiq_unique.slots import overrides
from dramatiq_unique.storage import migrations, schema
from dramatiq_unique.storage.database import is_postgres, open_database
from tests.conftest import REDIS_URL
from tests.durable import running_worker
from tests.helpers import wait_until
from tests.integration.storage.v1_schema import create_v1_table, index_definitions, index_names, insert_v1


@pytest.fixture
def v1_db(database_url):
    db = open_database(database_url)
    create_v1_table(db)
    yield db
    db.close()


@pytest.fixture
def env(database_url, monkeypatch):
    monkeypatch.setenv("DRAMATIQ_UNIQUE_DATABASE_URL", database_url)
    monkeypatch.setenv("DRAMATIQ_UNIQUE_REDIS_URL", REDIS_URL)


def _setup(broker, database_url, key_prefix):
    return dramatiq_unique.setup(broker, database=database_url, redis=REDIS_URL, key_prefix=key_prefix,
                                 redriver=False)


def test_upgrade_of_the_current_release_with_rows(v1_db, env, broker, database_url, key_prefix, capsys):
    """Given a version-1 table holding jobs: setup() refuses it naming the command; status says so
    (exit 1); a dry run changes nothing; migrate adds the history column (rows kept), makes the
    indexes partial, drops the running rows' one and adds the failed rows' one, is idempotent; then
    setup() accepts it, a job runs and its attempt is in its history."""
    done = insert_v1(v1_db, app=key_prefix, actor_name="job", result="7")
    failed = insert_v1(v1_db, app=key_prefix, actor_name="job", status="failed")
    indexes = index_names(v1_db)

    with pytest.raises(SchemaOutOfDate, match="version 1.*needs version 5.*migrate"):
        _setup(broker, database_url, key_prefix)

    assert main(["status"]) == 1
    assert "OUT OF DATE" in capsys.readouterr().out
    assert main(["jobs"]) == 1  # the other commands' read-only suite from the environment refuses it too
    assert "migrate" in capsys.readouterr().err
    assert main(["migrate", "--dry-run", "--json"]) == 0
    planned = json.loads(capsys.readouterr().out)
    assert planned[0]["version"] == 1 and any("history" in step for step in planned[0]["pending"])
    assert "history" not in schema.columns(bound(JobModel, v1_db, 0))

    assert main(["migrate"]) == 0
    assert "add column history" in capsys.readouterr().out
    assert {"history", "parked_at", "parked_attempt"} <= schema.columns(bound(JobModel, v1_db, 0))
    assert main(["migrate", "--json"]) == 0  # again: nothing to do
    again = json.loads(capsys.readouterr().out)
    assert again[0]["applied"] == [] and again[0]["version"] == schema.CURRENT_VERSION
    assert main(["status", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["current"] is True
    definitions = index_definitions(v1_db)
    version_5 = {"jobmodel_app_unique_hold_partial", "jobmodel_app_actor_name"}
    assert set(definitions) == (indexes - {"jobmodel_app_status_lease_until"}
                                | {"jobmodel_app_status_finished_at"} | version_5)
    partial = {name for name, sql in definitions.items() if " WHERE " in sql.upper()}
    on_status = {"jobmodel_app_status_process_after", "jobmodel_app_status_finished_at"}  # whole on SQLite
    assert partial == {"jobmodel_unique_key", "jobmodel_app_finished_at", "jobmodel_app_idempotency_hold",
                       "jobmodel_app_parked_on_created_at"} | version_5 | (on_status if is_postgres(v1_db) else set())
    assert "jobmodel_app_unique_hold" in definitions  # whole, for the earlier release, until migrate --contract

    suite = _setup(broker, database_url, key_prefix)
    try:
        old = dramatiq_unique.get_job(done)
        assert (old.status, old.result, old.attempts, old.history) == ("succeeded", 7, 1, None)
        assert dramatiq_unique.get_job(failed).last_error == "ValueError: old"

        @dramatiq.actor(broker=broker, track=True, max_retries=0)
        def job(n):
            return n

        with running_worker(broker, threads=1):
            sent = job.send(3)
            wait_until(lambda: dramatiq_unique.get_job(sent.message_id).status == "succeeded", timeout=10)
        (entry,) = dramatiq_unique.get_job(sent.message_id).history
        assert entry["attempt"] == 1 and entry["status"] == "succeeded" and entry["error"] is None
    finally:
        suite.close()


def test_a_job_model_with_extra_columns_and_indexes(database_url, broker, key_prefix):
    """A user's version-1 table with its own column and index: declaring the actor refuses it; migrate
    adds only our column, keeps theirs and their index and their data."""
    db = open_database(database_url)
    create_v1_table(db, table="export_jobs", prefix="exportjob", extra={"customer_id": "INTEGER"},
                    extra_indexes=("customer_id",))
    row = insert_v1(db, app=key_prefix, actor_name="export", table="export_jobs", customer_id=42)

    class ExportJob(JobModel):
        customer_id = pw.IntegerField(null=True, index=True)

        class Meta:
            table_name = "export_jobs"

    suite = _setup(broker, database_url, key_prefix)
    try:
        with pytest.raises(SchemaOutOfDate, match="export_jobs"):
            dramatiq.actor(lambda customer_id: None, broker=broker, actor_name="export", job_model=ExportJob)
        result = migrations.migrate(bound(ExportJob, db, 0))
        # history, parked_*; the whole indexes of the partial ones' names (5, on SQLite 4: none on the status)
        # and the running rows' one dropped, the partial ones made; version 5's made
        assert result.version == schema.CURRENT_VERSION and len(result.applied) == (11 if is_postgres(db) else 10)
        assert {"customer_id", "history"} <= schema.columns(bound(ExportJob, db, 0))
        assert "exportjob_customer_id" in index_names(db, "export_jobs")
        dramatiq.actor(lambda customer_id: None, broker=broker, actor_name="export", job_model=ExportJob)
        assert ExportJob.get(ExportJob.message_id == row).customer_id == 42
    finally:
        suite.close()
        db.close()


def test_two_migrations_at_once(v1_db, env, database_url):
    """Two processes migrating at once take turns: both succeed, one adds the column."""
    runs = [subprocess.Popen([sys.executable, "-m", "dramatiq_unique", "migrate", "--json"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE) for _ in range(2)]
    outputs = [run.communicate(timeout=60) for run in runs]
    assert [run.returncode for run in runs] == [0, 0], outputs
    applied = [json.loads(out)[0]["applied"] for out, _ in outputs]
    assert sorted(len(a) for a in applied) == [0, 11 if is_postgres(v1_db) else 10], applied  # as in the test above
    assert schema.version_of(bound(JobModel, v1_db, 0)) == schema.CURRENT_VERSION


def test_an_interrupted_migration_leaves_the_earlier_version(v1_db, monkeypatch):
    """A migration that fails after its first step is rolled back whole: still version 1, no column."""
    steps = migrations.MIGRATIONS[2]

    def failing(model, names):
        def boom():
            raise pw.OperationalError("interrupted")
        return [*steps[1](model, names), migrations.Step("fail", boom)]

    monkeypatch.setitem(migrations.MIGRATIONS, 2, (steps[0], failing))
    model = bound(JobModel, v1_db, 0)
    with pytest.raises(pw.OperationalError):
        migrations.migrate(model)
    assert "history" not in schema.columns(model) and schema.version_of(model) == 1
    monkeypatch.setitem(migrations.MIGRATIONS, 2, steps)
    assert migrations.migrate(model).version == schema.CURRENT_VERSION


def test_a_store_down(v1_db, database_url, monkeypatch, capsys):
    """With the second store down, migrate migrates the first and exits 1; status names the error."""
    monkeypatch.setenv("DRAMATIQ_UNIQUE_DATABASE_URL", f"{database_url} postgresql://postgres@127.0.0.1:1/test")
    assert main(["migrate", "--json"]) == 1
    first, second, limits = json.loads(capsys.readouterr().out)
    assert first["version"] == schema.CURRENT_VERSION and first["error"] is None and second["error"]
    assert (limits["table"], limits["version"], limits["error"]) == ("dramatiq_unique_limits", 1, None)
    assert main(["status"]) == 1
    assert "ERROR" in capsys.readouterr().out


def test_an_open_transaction_of_an_old_worker_bounds_the_wait(pg_url, monkeypatch, capsys):
    """PostgreSQL: an old worker's open transaction on the table holds ALTER TABLE back; the migration
    gives up after --lock-timeout (exit 1, rolled back) instead of queueing every worker behind it."""
    db, worker = open_database(pg_url), open_database(pg_url)
    create_v1_table(db)
    monkeypatch.setenv("DRAMATIQ_UNIQUE_DATABASE_URL", pg_url)
    try:
        with worker.atomic():
            worker.execute_sql('SELECT count(*) FROM "dramatiq_unique_jobs"').fetchone()
            assert main(["migrate", "--lock-timeout", "200", "--json"]) == 1
            result, limits = json.loads(capsys.readouterr().out)
            assert limits["table"] == "dramatiq_unique_limits" and limits["error"] is None
            assert "lock timeout" in result["error"] and schema.version_of(bound(JobModel, db, 0)) == 1
        assert main(["migrate"]) == 0
    finally:
        worker.close()
        db.close()


def test_a_new_database_is_created_at_the_current_version(suite):
    assert schema.recorded(JobModel) == schema.CURRENT_VERSION
    assert migrations.status(JobModel).current


def test_the_limits_table_has_a_version_of_its_own(suite, database_url, monkeypatch, capsys):
    """The run-time limits' table is created at set-up at its own version (1), not the job tables';
    status lists it; migrate creates it in a database whose job tables exist without it."""
    limits = overrides.model_of(suite)
    assert schema.recorded(limits) == 1 and migrations.status(limits).current
    monkeypatch.setenv("DRAMATIQ_UNIQUE_DATABASE_URL", database_url)
    assert main(["status", "--json"]) == 0
    assert {t["table"]: (t["version"], t["target"]) for t in json.loads(capsys.readouterr().out)} == {
        "dramatiq_unique_jobs": (schema.CURRENT_VERSION, schema.CURRENT_VERSION), "dramatiq_unique_limits": (1, 1)}
    limits._meta.database.execute_sql(f'DROP TABLE {limits._meta.table_name}')
    assert main(["status"]) == 1
    assert "dramatiq_unique_limits" in capsys.readouterr().out
    assert main(["migrate", "--json"]) == 0
    applied = {t["table"]: t["applied"] for t in json.loads(capsys.readouterr().out)}
    assert applied == {"dramatiq_unique_jobs": [], "dramatiq_unique_limits": ["create the table at version 1"]}
    assert schema.version_of(limits) == 1


APP = '''
import os
import dramatiq
import peewee as pw
from dramatiq.brokers.redis import RedisBroker
import dramatiq_unique

broker = RedisBroker(url=os.environ["DRAMATIQ_UNIQUE_REDIS_URL"], namespace=os.environ["TEST_PREFIX"] + "-app")
dramatiq_unique.setup(broker, database=os.environ["TEST_DATABASE"], redis=os.environ["DRAMATIQ_UNIQUE_REDIS_URL"],
                      key_prefix=os.environ["TEST_PREFIX"], redriver=False)


class ExportJob(dramatiq_unique.JobModel):
    customer_id = pw.IntegerField(null=True, index=True)

    class Meta:
        table_name = "export_jobs"


@dramatiq.actor(broker=broker, job_model=ExportJob)
def export(customer_id):
    pass
'''


def test_the_commands_with_an_app(v1_db, database_url, key_prefix, tmp_path, monkeypatch, capsys):
    """With APP: the app's every table (its job_model's too) in status and migrate; an out-of-date app
    still imports for them; check then finds the schema current."""
    create_v1_table(v1_db, table="export_jobs", prefix="exportjob", extra={"customer_id": "INTEGER"})
    name = f"schema_app_{key_prefix.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(APP)
    monkeypatch.setenv("TEST_DATABASE", database_url)
    monkeypatch.setenv("TEST_PREFIX", key_prefix)
    monkeypatch.setenv("DRAMATIQ_UNIQUE_REDIS_URL", REDIS_URL)
    try:
        assert main(["status", name, "--path", str(tmp_path), "--json"]) == 1
        tables = {t["table"]: t["version"] for t in json.loads(capsys.readouterr().out)}
        assert tables == {"dramatiq_unique_jobs": 1, "export_jobs": 1, "dramatiq_unique_limits": 1}
        assert main(["migrate", name, "--path", str(tmp_path)]) == 0
        capsys.readouterr()
        assert main(["status", name, "--path", str(tmp_path)]) == 0
        capsys.readouterr()
        assert main(["check", name, "--path", str(tmp_path), "--json"]) == 1  # no re-drive pass yet: a warning
        report = json.loads(capsys.readouterr().out)
        assert {f["check"]: f["severity"] for f in report["findings"]}["redrive"] == "warning"
        assert all(f["severity"] == "ok" for f in report["findings"] if f["check"] == "schema")
    finally:
        sys.modules.pop(name, None)
        dramatiq_unique.suite.current().close()
