"""Several job stores (dramatiq_unique.storage.stores), without a server: SQLite files, one of
them in a folder that does not exist (a store that cannot be opened, as a PostgreSQL server down)."""

from __future__ import annotations

import time
from types import SimpleNamespace

import peewee as pw
import pytest

from dramatiq_unique import DatabaseUnavailable, InvalidOption, JobModel
from dramatiq_unique.context import MARKER, job_model, store_of
from dramatiq_unique.storage import jobs, schema
from dramatiq_unique.storage.stores import STORE, Stores, base_of, specs
from dramatiq_unique.suite import ActorConfig, Suite
from dramatiq_unique.unique.enqueue import may_fail_over


class ExportJob(JobModel):
    customer = pw.IntegerField(null=True)

    class Meta:
        table_name = "export_jobs"


class Jobs(JobModel):
    """A job table of these tests' own, bound to each test's primary (as setup() binds the models)."""

    class Meta:
        table_name = "jobs"


def sqlite(path) -> pw.SqliteDatabase:
    return pw.SqliteDatabase(str(path))


def stores_of(*databases: pw.Database, down_for: float = 50) -> Stores:
    Jobs.bind(databases[0])
    return Stores(databases, down_for=down_for)


@pytest.fixture
def two(tmp_path) -> Stores:
    """A primary that cannot be opened (its folder is missing) and a secondary that can."""
    return stores_of(sqlite(tmp_path / "missing" / "primary.db"), sqlite(tmp_path / "secondary.db"))


def fields(message_id: str) -> dict:
    return {"message_id": message_id, "actor_name": "a", "queue_name": "default", "options": {}}


def test_the_primary_is_the_model_itself_and_another_store_a_cached_subclass(tmp_path):
    primary, secondary = sqlite(tmp_path / "p.db"), sqlite(tmp_path / "s.db")
    stores = Stores([primary, secondary])
    assert stores.model_in(ExportJob, 0) is ExportJob
    other = stores.model_in(ExportJob, 1)
    assert other is stores.model_in(ExportJob, 1) and issubclass(other, ExportJob)
    assert other._meta.database is secondary and other._meta.table_name == "export_jobs"
    assert "customer" in other._meta.fields and base_of(other) is ExportJob and base_of(ExportJob) is ExportJob
    with pytest.raises(InvalidOption, match="same order"):
        stores.model_in(ExportJob, 2)
    assert stores.index_of(other) == 1 and stores.index_of(ExportJob) == 0


def test_the_marker_names_the_store_and_no_marker_means_the_primary(tmp_path):
    stores = Stores([sqlite(tmp_path / "p.db"), sqlite(tmp_path / "s.db")])
    suite = SimpleNamespace(stores=stores)
    assert store_of({}) == 0 and store_of({MARKER: {"id": 3}}) == 0
    assert store_of({MARKER: {"id": 3, STORE: 1}}) == 1
    assert job_model(suite, JobModel, {MARKER: {"id": 3}}) is JobModel
    assert job_model(suite, JobModel, {MARKER: {STORE: 1}})._meta.database is stores.databases[1]


def test_a_send_fails_over_to_the_next_store_and_remembers_the_primary_down(two, caplog, monkeypatch):
    clock = [1000.0]  # the stores' clock, moved by hand: a loaded machine cannot make down_for pass early
    monkeypatch.setattr("dramatiq_unique.storage.stores.time.monotonic", lambda: clock[0])
    tried = []
    sends = iter(range(1_000_000))

    def insert(model):
        tried.append(model._meta.database)
        return jobs.adopt(model, fields(f"m{len(tried)}-{next(sends)}"))[0]

    marker: dict = {}
    model, row_id = two.insert(Jobs, insert, marker)
    assert model._meta.database is two.databases[1] and marker == {STORE: 1}
    assert model.get_by_id(row_id).message_id.startswith("m1-")  # the primary failed at its table check
    assert two.is_down(0) and "does not answer" in caplog.text
    tried.clear()
    two.insert(Jobs, insert, {})
    assert tried == [two.databases[1]], "while remembered down, the primary is not tried"
    clock[0] += 0.06
    assert not two.is_down(0)
    two.insert(Jobs, insert, {})
    assert two.is_down(0), "after down_for the primary is tried again (and fails again)"


def test_new_rows_go_back_to_the_primary_once_it_answers(tmp_path):
    primary = sqlite(tmp_path / "later" / "primary.db")
    stores = stores_of(primary, sqlite(tmp_path / "secondary.db"), down_for=1)
    marker: dict = {}
    stores.insert(Jobs, lambda model: jobs.adopt(model, fields("a"))[0], marker)
    assert marker == {STORE: 1}
    (tmp_path / "later").mkdir()  # the primary can be opened now: its table is made on first use
    time.sleep(0.01)
    model, _ = stores.insert(Jobs, lambda model: jobs.adopt(model, fields("b"))[0], marker)
    assert model is Jobs and marker == {} and not stores.is_down(0)
    primary.close()


def test_a_send_that_needs_the_primary_raises_at_once_while_it_is_down(two):
    calls = []
    with pytest.raises(pw.OperationalError):
        two.on_primary(Jobs, lambda: "a unique send", lambda: calls.append(1))
    with pytest.raises(DatabaseUnavailable, match="a unique send needs the primary"):
        two.on_primary(Jobs, lambda: "a unique send", lambda: calls.append(1))
    assert calls == []


def test_one_store_writes_as_before(tmp_path):
    db = sqlite(tmp_path / "only.db")
    stores = Stores([db])
    assert not stores.several
    assert stores.on_primary(JobModel, lambda: pytest.fail("not asked"), lambda: 7) == 7


def config(**options) -> ActorConfig:
    return ActorConfig("a", lambda n=None: None, {"track": True, **options}, JobModel, ())


@pytest.mark.parametrize("options, message, fails_over", [
    ({}, {}, True),
    ({"unique_args": ["n"]}, {}, False),
    ({}, {"unique_args": ["n"]}, False),
    ({"unique_args": ["n"], "unique_lock": "while_executing"}, {}, False),
    ({"concurrency_limit": 2}, {}, False),
    ({"concurrency_key": ["n"]}, {}, False),
    ({}, {"idempotency_key": "k"}, False),
])
def test_only_plain_tracked_sends_may_fail_over(options, message, fails_over):
    assert may_fail_over(config(**options), message) is fails_over


@pytest.mark.parametrize("database", [[], (), 5, [5]])
def test_a_bad_list_of_stores_is_refused(database):
    with pytest.raises(InvalidOption):
        Suite(database=database, redis="redis://127.0.0.1:1/0")


def test_a_store_listed_twice_is_refused(tmp_path):
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    with pytest.raises(InvalidOption, match="twice"):
        Suite(database=[url, url], redis="redis://127.0.0.1:1/0")
    db = sqlite(tmp_path / "other.db")
    with pytest.raises(InvalidOption, match="twice"):
        Stores([db, db])
    assert specs(url) == [url] and specs([url, db]) == [url, db]


def test_a_store_down_at_set_up_gets_its_tables_when_it_first_answers(tmp_path, monkeypatch):
    made = []
    monkeypatch.setattr(schema, "create_or_migrate", lambda model: made.append(model._meta.database))
    stores = Stores([sqlite(tmp_path / "p.db"), sqlite(tmp_path / "s.db")])
    stores.later(1, lambda: made.append("step"))
    stores.ensure(JobModel, 1)
    stores.ensure(JobModel, 1)
    assert made == ["step", stores.databases[1]]
