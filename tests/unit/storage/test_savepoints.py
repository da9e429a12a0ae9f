"""What a transaction holds for its commit follows its savepoints (dramatiq_unique.storage.savepoints), on an
in-memory SQLite database: peewee's own blocks, SQL given to execute_sql, and the transaction's ends."""

from __future__ import annotations

import threading

import peewee as pw
import pytest

from dramatiq_unique.storage import savepoints
from dramatiq_unique.storage.database import open_database


@pytest.fixture
def db():
    db = open_database("sqlite:///:memory:")
    db.connect()
    yield db
    db.close()


@pytest.fixture
def flushed() -> list[list]:
    return []


def holder(db, flushed):
    return lambda item: savepoints.hold(db, flushed.append, item)


class Abort(Exception):
    pass


def test_a_commit_hands_over_what_the_transaction_held_once(db, flushed):
    hold = holder(db, flushed)
    with db.atomic():
        hold(1)
        hold(2)
        assert flushed == []
    assert flushed == [[1, 2]]
    with db.atomic():
        pass
    assert flushed == [[1, 2]]


def test_savepoints_keep_and_drop_as_the_database_does(db, flushed):
    hold = holder(db, flushed)
    with db.atomic():
        hold("kept")
        with pytest.raises(Abort):
            with db.atomic():
                hold("dropped")
                with db.atomic():
                    hold("released into the dropped one")
                raise Abort
        with db.atomic() as sp:
            hold("dropped by sp.rollback()")
            sp.rollback()
            hold("held after sp.rollback()")
        with db.savepoint():
            hold("released")
    assert flushed == [["kept", "held after sp.rollback()", "released"]]


def test_the_transactions_rollback_drops_everything_and_the_block_goes_on(db, flushed):
    hold = holder(db, flushed)
    with db.atomic() as txn:
        hold("dropped")
        txn.rollback()
        hold("kept")
    with pytest.raises(Abort):
        with db.atomic():
            hold("dropped with the exception")
            raise Abort
    assert flushed == [["kept"]]


def test_a_commit_inside_the_block_hands_over_what_it_committed(db, flushed):
    hold = holder(db, flushed)
    with pytest.raises(Abort):
        with db.atomic() as txn:
            hold("committed")
            txn.commit()
            assert flushed == [["committed"]]
            hold("dropped")
            raise Abort
    assert flushed == [["committed"]]


def test_savepoints_in_sql_given_to_execute_sql_are_followed_as_the_database_names_them(db, flushed):
    hold = holder(db, flushed)
    with db.atomic():
        hold(1)
        db.execute_sql("savepoint a")
        hold(2)
        db.execute_sql("SAVEPOINT a")  # the same name again: the newer one is the one rolled back to
        hold(3)
        db.execute_sql("ROLLBACK TO A")
        hold(4)
        db.execute_sql("release savepoint a")  # the newer a; the older one is still there
        db.execute_sql('ROLLBACK TRANSACTION TO SAVEPOINT "a";')
        hold(5)
        db.execute_sql("RELEASE a")
    assert flushed == [[1, 5]]


def test_savepoints_made_through_a_proxy_are_followed(db, flushed):
    proxy = pw.DatabaseProxy()
    proxy.initialize(db)
    hold = holder(db, flushed)
    with proxy.atomic():
        hold("kept")
        with pytest.raises(Abort):
            with proxy.atomic():
                hold("dropped")
                raise Abort
    assert flushed == [["kept"]]


def test_each_thread_holds_for_its_own_transaction(flushed, tmp_path):
    shared = open_database(f"sqlite:///{tmp_path / 'shared.db'}")  # DEFERRED: two transactions that write nothing
    hold = holder(shared, flushed)
    other_held = threading.Event()
    rolled_back = threading.Event()

    def other() -> None:
        with pytest.raises(Abort):
            with shared.atomic(lock_type="DEFERRED"):
                hold("other thread, rolled back")
                other_held.set()
                rolled_back.wait(10)
                raise Abort

    with shared.atomic(lock_type="DEFERRED"):
        hold("this thread")
        thread = threading.Thread(target=other)
        thread.start()
        assert other_held.wait(10)
    rolled_back.set()
    thread.join(10)
    assert flushed == [["this thread"]]
    shared.close()


def test_a_flush_that_raises_does_not_turn_the_commit_into_an_error(db, flushed, caplog):
    def fail(items):
        raise RuntimeError("broken")

    with db.atomic():
        savepoints.hold(db, fail, 1)
        savepoints.hold(db, flushed.append, 2)
    assert flushed == [[2]] and "Could not hand 1 items over" in caplog.text


def test_hold_refuses_outside_a_transaction_and_on_a_database_it_cannot_follow(db):
    with pytest.raises(RuntimeError, match="outside a transaction"):
        savepoints.hold(db, print, 1)
    plain = pw.SqliteDatabase(":memory:")
    with plain.atomic():
        with pytest.raises(RuntimeError, match="does not follow savepoints"):
            savepoints.hold(plain, print, 1)
