"""The outbox follows the caller's savepoints and rollbacks (dramatiq_unique.storage.savepoints,
dramatiq_unique.durable.outbox): what a rolled-back savepoint or transaction sent is never published, and a
replaced job runs with the arguments of its last committed send.  SQLite and PostgreSQL, URL-opened and given.
"""

from __future__ import annotations

from typing import Iterator

import dramatiq
import peewee as pw
import pytest
from dramatiq.brokers.redis import RedisBroker
from playhouse import db_url

import dramatiq_unique
from dramatiq_unique import transaction
from dramatiq_unique.durable import outbox
from tests.conftest import REDIS_URL
from tests.durable import RedisServer, broker_messages, running_worker
from tests.helpers import job_of, wait_until


class Note(pw.Model):
    """The caller's own table, in the suite's database."""

    text = pw.TextField()


@pytest.fixture
def notes(suite):
    Note.bind(suite.db)
    suite.db.create_tables([Note])
    return Note


@pytest.fixture
def notify(suite):
    """An untracked actor: its sends are held in memory until the commit."""

    @dramatiq.actor
    def notify(text):
        pass

    return notify


def published(broker) -> list[list]:
    return sorted(m["args"] for m in broker_messages(broker))


class Abort(Exception):
    pass


def roll_back_by_exception(db: pw.Database, send) -> None:
    with pytest.raises(Abort):
        with db.atomic():
            send()
            raise Abort


def roll_back_explicitly(db: pw.Database, send) -> None:
    with db.atomic() as savepoint:
        send()
        savepoint.rollback()


def roll_back_a_named_savepoint(db: pw.Database, send) -> None:
    with pytest.raises(Abort):
        with db.savepoint():
            send()
            raise Abort


def roll_back_a_nested_transaction_block(db: pw.Database, send) -> None:
    with transaction() as txn:
        send()
        txn.rollback()


ROLLBACKS = [roll_back_by_exception, roll_back_explicitly, roll_back_a_named_savepoint,
             roll_back_a_nested_transaction_block]


@pytest.mark.parametrize("roll_back", ROLLBACKS, ids=lambda f: f.__name__)
def test_an_untracked_send_in_a_rolled_back_savepoint_is_never_published(suite, broker, notes, notify, roll_back):
    with transaction():
        notify.send("before")
        notes.create(text="kept")
        roll_back(suite.db, lambda: (notes.create(text="undone"), notify.send("undone")))
        notify.send("after")
    assert [n.text for n in notes.select()] == ["kept"]
    assert published(broker) == [["after"], ["before"]]


@pytest.mark.parametrize("roll_back", ROLLBACKS, ids=lambda f: f.__name__)
def test_a_tracked_send_in_a_rolled_back_savepoint_is_forgotten_at_once(suite, broker, charge, roll_back, monkeypatch):
    """Its row is gone with the savepoint, and so is its held send: the commit claims only the others."""
    claimed: list[int] = []
    original = outbox.claim_and_publish

    def spy(suite, model, held):
        claimed.append(len(held))
        return original(suite, model, held)

    monkeypatch.setattr(outbox, "claim_and_publish", spy)
    with transaction():
        kept = charge.send("kept")
        roll_back(suite.db, lambda: [charge.send(f"undone {n}") for n in range(3)])
    assert claimed == [1]
    assert published(broker) == [["kept"]] and job_of(kept).status == "queued"


def test_sends_before_the_transactions_own_rollback_are_dropped(suite, broker, notes, notify, charge):
    """txn.rollback() undoes the whole transaction so far, and the block goes on in a new one."""
    with transaction() as txn:
        notify.send("undone")
        undone = charge.send("undone")
        notes.create(text="undone")
        txn.rollback()
        notify.send("after")
        after = charge.send("after")
    assert notes.select().count() == 0
    assert job_of(undone) is None and job_of(after).status == "queued"
    assert published(broker) == [["after"], ["after"]]


def test_a_rollback_of_the_callers_own_transaction_drops_the_blocks_sends(suite, broker, notify):
    """A transaction() inside the caller's atomic() publishes at the caller's commit, and not at all if an
    enclosing savepoint of the caller rolls back after the block ended."""
    with suite.db.atomic():
        with pytest.raises(Abort):
            with suite.db.atomic():
                with transaction():
                    notify.send("undone")
                raise Abort
        with transaction():
            notify.send("kept")
    assert published(broker) == [["kept"]]


def test_a_commit_inside_the_block_publishes_what_it_committed(suite, broker, notify, charge):
    """txn.commit() commits the sends so far: they are published then, whatever the rest of the block does."""
    with pytest.raises(Abort):
        with transaction() as txn:
            notify.send("committed")
            committed = charge.send("committed")
            txn.commit()
            assert published(broker) == [["committed"], ["committed"]]
            notify.send("undone")
            raise Abort
    assert job_of(committed).status == "queued"
    assert published(broker) == [["committed"], ["committed"]]


def test_a_released_savepoint_keeps_its_sends_for_the_enclosing_one(suite, broker, notify):
    with transaction():
        with pytest.raises(Abort):
            with suite.db.atomic():
                with suite.db.atomic():
                    notify.send("inner, released, then undone with the outer savepoint")
                notify.send("outer, undone")
                raise Abort
        with suite.db.atomic():
            with suite.db.atomic():
                notify.send("inner, released, kept")
    assert published(broker) == [["inner, released, kept"]]


@pytest.fixture
def report(suite):
    runs: list[str] = []

    @dramatiq.actor(unique_args=["key"], unique_on_conflict="replace", max_retries=0)
    def report(key, version):
        runs.append(version)
        return version

    report.runs = runs
    return report


def test_a_replace_rolled_back_in_a_savepoint_never_runs(suite, broker, report):
    """The job runs once, with the arguments of its last committed send: the rolled-back replace's message
    is never published, and the committed replace's is."""
    first = report.send(key=1, version="committed first")
    with pytest.raises(Abort):
        with transaction():
            report.send(key=1, version="rolled back with the transaction")
            raise Abort
    job = job_of(first)
    assert (job.status, job.revision, job.kwargs["version"]) == ("queued", 0, "committed first")
    with transaction():
        roll_back_by_exception(suite.db, lambda: report.send(key=1, version="rolled back"))
        assert job_of(first).kwargs["version"] == "committed first"
        report.send(key=1, version="committed last")
    job = job_of(first)
    assert job.kwargs["version"] == "committed last" and job.revision == 1
    versions = sorted(m["kwargs"]["version"] for m in broker_messages(broker))
    assert versions == ["committed first", "committed last"]  # the first one's message is superseded
    with running_worker(broker, threads=1):
        wait_until(lambda: job_of(first).status == "succeeded", timeout=15)
    assert report.runs == ["committed last"] and job_of(first).result == "committed last"


def raw_savepoint(db: pw.Database, send) -> None:
    """A savepoint made on the driver's own cursor, past peewee: the outbox does not see it roll back."""
    cursor = db.cursor()
    cursor.execute('SAVEPOINT "raw"')
    send()
    cursor.execute('ROLLBACK TO SAVEPOINT "raw"')


def test_a_replace_rolled_back_where_the_outbox_cannot_see_it_claims_nothing(suite, broker, report):
    """The rolled-back replace's held send outlives its savepoint, and gave the row the revision that the
    committed replace gives it again: its claim finds the row stamped by the other send, and takes nothing.
    (Delayed sends: claimed one by one, in the order they were sent.)"""
    first = report.send(key=1, version="committed first")
    with transaction():
        raw_savepoint(suite.db, lambda: report.send_with_options(
            kwargs=dict(key=1, version="rolled back"), delay=60_000))
        report.send_with_options(kwargs=dict(key=1, version="committed last"), delay=60_000)
    job = job_of(first)
    assert (job.status, job.revision, job.kwargs["version"]) == ("queued", 1, "committed last")
    delayed = [m for m in broker_messages(broker) if m["queue_name"] == "default.DQ"]
    assert [(m["kwargs"]["version"], m["options"]["dramatiq_unique"]["rev"]) for m in delayed] == [
        ("committed last", 1)]


def test_a_replace_rolled_back_where_the_outbox_cannot_see_it_after_a_committed_one_claims_nothing(
    suite, broker, report
):
    """The committed replace, then one rolled back unseen: of the two held sends of the row, the batch
    publishes the one whose claim took the row, not the last one held."""
    first = report.send(key=1, version="committed first")
    with transaction():
        report.send(key=1, version="committed last")
        raw_savepoint(suite.db, lambda: report.send(key=1, version="rolled back"))
    assert job_of(first).kwargs["version"] == "committed last"
    versions = sorted(m["kwargs"]["version"] for m in broker_messages(broker))
    assert versions == ["committed first", "committed last"]
    with running_worker(broker, threads=1):
        wait_until(lambda: job_of(first).status == "succeeded", timeout=15)
    assert report.runs == ["committed last"]


def test_a_replace_in_a_transaction_is_held_with_its_row_and_waits_pending_if_the_broker_is_down(
    database_url, key_prefix
):
    """The replaced job is pending until the commit claims it; a broker outage at the commit leaves it
    pending, and the next re-drive pass sends it with the new arguments."""
    server = RedisServer().start()
    broker = RedisBroker(url=server.url, namespace=f"{key_prefix}-replace")
    dramatiq.set_broker(broker)
    suite = dramatiq_unique.setup(broker, database=database_url, redis=REDIS_URL, key_prefix=key_prefix,
                                  redriver=False)
    runs = []

    @dramatiq.actor(unique_args=["key"], unique_on_conflict="replace", max_retries=0)
    def report(key, version):
        runs.append(version)

    try:
        first = report.send(key=1, version="old")
        with transaction():
            report.send(key=1, version="new")
            assert job_of(first).status == "pending"
            server.stop()  # the broker is gone at the commit (and the first message with it)
        job = job_of(first)
        assert (job.status, job.kwargs["version"]) == ("pending", "new")
        server.start()
        assert dramatiq_unique.redrive().sent == 1
        with running_worker(broker):
            wait_until(lambda: job_of(first).status == "succeeded", timeout=15)
        assert runs == ["new"]
    finally:
        server.stop()
        broker.close()
        suite.db.close()


@pytest.fixture
def given(broker, database_url, key_prefix) -> Iterator[dramatiq_unique.Suite]:
    """A suite on a peewee Database the caller made (not a URL), reached through a DatabaseProxy by the caller."""
    db = db_url.connect(database_url)
    assert type(db) in (pw.SqliteDatabase, pw.PostgresqlDatabase)
    suite = dramatiq_unique.setup(broker, database=db, redis=REDIS_URL, key_prefix=key_prefix, redriver=False)
    yield suite
    db.close()


def test_a_given_database_and_a_proxy_to_it_follow_savepoints_too(given, broker):
    @dramatiq.actor
    def notify(text):
        pass

    proxy = pw.DatabaseProxy()
    proxy.initialize(given.db)
    with transaction():
        roll_back_by_exception(given.db, lambda: notify.send("undone, on the database"))
        roll_back_by_exception(proxy, lambda: notify.send("undone, through the proxy"))
        with proxy.atomic() as savepoint:
            notify.send("undone, rolled back through the proxy")
            savepoint.rollback()
        notify.send("kept")
    assert published(broker) == [["kept"]]
