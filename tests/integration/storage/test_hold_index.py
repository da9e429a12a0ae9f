"""The unique holds' partial index (schema version 5) on PostgreSQL: made by ``migrate`` beside the whole
index it replaces, which the earlier release's inserts name, and alone after ``migrate --contract``; the
reads of a hold and the adoption of rows of no app keep an index of their own to read."""

from __future__ import annotations

import datetime
from typing import Iterator

import peewee as pw
import pytest

from dramatiq_unique import JobModel
from dramatiq_unique.cli import main
from dramatiq_unique.durable.scope import NO_APP
from dramatiq_unique.health.target import bound
from dramatiq_unique.storage import jobs, migrations, schema
from dramatiq_unique.storage.database import is_postgres, open_database
from tests.conftest import REDIS_URL

TABLE = "dramatiq_unique_jobs"
WHOLE, PARTIAL, NO_APP_INDEX = "jobmodel_app_unique_hold", "jobmodel_app_unique_hold_partial", "jobmodel_app_actor_name"
#: A unique send of the earlier release (version 4): its ON CONFLICT names the holds' columns, no predicate.
EARLIER_INSERT = (
    f'INSERT INTO "{TABLE}" ("app", "message_id", "actor_name", "queue_name", "args", "kwargs", "options", "status", '
    '"attempts", "revision", "created_at", "fencing_token", "unique_hold") '
    "VALUES ('a', %s, 'job', 'default', '[]', '{}', '{}', 'queued', 0, 0, now(), 0, %s) "
    'ON CONFLICT ("app", "unique_hold") DO NOTHING RETURNING "id"'
)


@pytest.fixture
def model(pg_url) -> Iterator[type[JobModel]]:
    """The job table as version 4 left it: the whole holds' index, neither of version 5's."""
    db = open_database(pg_url)
    made = bound(JobModel, db, 0)
    schema.create_or_migrate(made)
    db.execute_sql(f'DROP INDEX "{PARTIAL}"')
    db.execute_sql(f'DROP INDEX "{NO_APP_INDEX}"')
    db.execute_sql(f'CREATE UNIQUE INDEX "{WHOLE}" ON "{TABLE}" ("app", "unique_hold")')
    with schema.locked(db):
        schema.record(made, 4)
    yield made
    db.close()


def indexes(model: type[JobModel]) -> dict[str, str]:
    db = model._meta.database
    return {index.name: index.sql for index in db.get_indexes(TABLE, schema.where(model))}


def send(model: type[JobModel], message_id: str, hold: str) -> tuple:
    """This release's unique insert."""
    now = datetime.datetime.utcnow()
    values = dict(app="a", message_id=message_id, actor_name="job", queue_name="default", args=[], kwargs={},
                  options={}, status="queued", attempts=0, revision=0, created_at=now, fencing_token=0,
                  unique_key=hold, unique_hold=hold)
    return jobs.insert_or_holder(model, values)


def earlier_send(model: type[JobModel], message_id: str, hold: str) -> list:
    return model._meta.database.execute_sql(EARLIER_INSERT, (message_id, hold)).fetchall()


def test_the_command_line_names_the_contract(model, pg_url, monkeypatch, capsys):
    """``status`` lists the contract under the table, which it finds current; ``migrate --contract
    --dry-run`` lists it as pending and changes nothing; ``migrate --contract`` does it."""
    monkeypatch.setenv("DRAMATIQ_UNIQUE_DATABASE_URL", pg_url)
    monkeypatch.setenv("DRAMATIQ_UNIQUE_REDIS_URL", REDIS_URL)
    assert main(["migrate"]) == 0 and main(["status"]) == 0
    out = capsys.readouterr().out
    assert f"after the upgrade (migrate --contract): drop index {WHOLE}" in out and "OUT OF DATE" not in out
    assert main(["migrate", "--contract", "--dry-run"]) == 0
    assert f"    drop index {WHOLE}" in capsys.readouterr().out and WHOLE in indexes(model)
    assert main(["migrate", "--contract"]) == 0
    assert WHOLE not in indexes(model) and "migrate --contract" not in (main(["status"]), capsys.readouterr().out)[1]


def test_both_releases_send_between_the_migration_and_the_contract(model):
    """After ``migrate``: both indexes stand, each release's insert refuses the other's hold; ``status`` names
    the contract; after ``migrate --contract`` the whole index is gone, this release's insert still refuses
    a duplicate, and the earlier release's insert is refused (why the contract waits for its processes)."""
    done = migrations.migrate(model)
    assert done.version == 5 and schema.recorded(model) == 5
    found = indexes(model)
    assert WHOLE in found and " WHERE " not in found[WHOLE].upper()
    assert "WHERE (unique_hold IS NOT NULL)" in found[PARTIAL]
    assert "WHERE ((app)::text = ''::text)" in found[NO_APP_INDEX]
    assert migrations.status(model).contract == [
        f"drop index {WHOLE} (replaced by a partial one; no process of an earlier release may run)"]

    first, _ = send(model, "m1", "k1")
    assert first is not None and earlier_send(model, "m2", "k1") == []  # the earlier release meets this one's hold
    (held,) = earlier_send(model, "m3", "k2")
    assert send(model, "m4", "k2")[1].id == held[0]  # and this one meets the earlier one's

    planned = migrations.migrate(model, dry_run=True, contract=True)
    assert planned.pending == done.contract and planned.contract == [] and WHOLE in indexes(model)
    contracted = migrations.migrate(model, contract=True)
    assert contracted.applied == done.contract and contracted.contract == []
    assert WHOLE not in indexes(model) and PARTIAL in indexes(model)
    assert send(model, "m5", "k1")[1].id == first and send(model, "m6", "k3")[0] is not None
    with pytest.raises(pw.ProgrammingError, match="no unique or exclusion constraint"):
        with model._meta.database.atomic():
            earlier_send(model, "m7", "k4")


def test_a_table_made_at_version_5_has_no_whole_holds_index(model):
    """A new database gets the partial index alone: nothing to contract."""
    db = model._meta.database
    db.execute_sql(f'DROP TABLE "{TABLE}"')
    db.execute_sql('DELETE FROM "dramatiq_unique_schema"')
    schema.create_or_migrate(model)
    assert WHOLE not in indexes(model) and {PARTIAL, NO_APP_INDEX} <= set(indexes(model))
    assert migrations.status(model).contract == []


@pytest.mark.parametrize("query", ["holder", "holders", "adoption"])
def test_the_reads_of_holds_and_of_rows_of_no_app_use_an_index(database_url, query):
    """On 20,000 rows, analyzed, with no whole holds' index (a new table): a hold is read through the partial
    index, and the pass that adopts rows of no app reads its empty index instead of the whole table."""
    db = open_database(database_url)
    model = bound(JobModel, db, 0)
    schema.create_or_migrate(model)
    numbers = ("generate_series(1, 20000) AS n" if is_postgres(db) else
               "(WITH RECURSIVE s(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM s WHERE n < 20000) SELECT n FROM s)")
    db.execute_sql(
        f'INSERT INTO "{TABLE}" ("app", "message_id", "actor_name", "queue_name", "args", "kwargs", "options", '
        '"status", "attempts", "revision", "created_at", "fencing_token", "unique_hold") '
        "SELECT 'a', 'plan-' || n, 'job', 'default', '[]', '{}', '{}', 'queued', 0, 0, CURRENT_TIMESTAMP, 0, "
        f"CASE WHEN n % 10 = 0 THEN 'k' || n END FROM {numbers}".replace("%", "%%" if is_postgres(db) else "%"))
    db.execute_sql(f'ANALYZE "{TABLE}"')
    if query == "holder":
        sql, params = model.select().where((model.app == "a") & (model.unique_hold == "k10")).sql()
    elif query == "holders":
        sql, params = model.select().where((model.app == "a") & model.unique_hold.in_(["k10", "k20"])).sql()
    else:  # as durable/scope.py's adopt() reads them
        cond = (model.app == NO_APP) & model.actor_name.in_(["job"]) & model.status.not_in(["succeeded"])
        sql, params = model.select(model.id).where(cond).limit(100).sql()
    explain = "EXPLAIN" if is_postgres(db) else "EXPLAIN QUERY PLAN"
    plan = "\n".join(str(row[-1]) for row in db.execute_sql(f"{explain} {sql}", params).fetchall())
    db.close()
    assert "Seq Scan" not in plan and "SCAN " not in plan, plan
    assert (NO_APP_INDEX if query == "adoption" else PARTIAL) in plan, plan
