"""dramatiq_unique.contrib.sqlalchemy: ``setup(database=engine)``; sends inside ``session.begin()`` commit and
roll back with the session's writes, savepoints (``begin_nested()``) included.  PostgreSQL, real Redis brokers."""

from __future__ import annotations

from typing import Iterator

import dramatiq
import pytest
from dramatiq.brokers.redis import RedisBroker
from sqlalchemy import String, create_engine, select
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

import dramatiq_unique
from dramatiq_unique.contrib.sqlalchemy import EngineDatabase
from dramatiq_unique.storage.models import JobModel
from tests.conftest import REDIS_URL
from tests.durable import RedisServer, running_worker
from tests.helpers import job_of, wait_until
from tests.integration.contrib import published, race


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "orders"
    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(50))


@pytest.fixture
def engine(pg_url: str) -> Iterator:
    engine = create_engine(pg_url.replace("postgresql://", "postgresql+psycopg2://"))
    Base.metadata.create_all(engine)
    yield engine
    engine.dispose()


@pytest.fixture
def sa_suite(engine, broker, key_prefix: str) -> Iterator[dramatiq_unique.Suite]:
    suite = dramatiq_unique.setup(broker, database=engine, redis=REDIS_URL, key_prefix=key_prefix, redriver=False)
    yield suite
    suite.db.close()


@pytest.fixture
def charge(sa_suite):
    @dramatiq.actor(track=True)
    def charge(order: str) -> str:
        return order

    return charge


def test_setup_takes_the_engine(sa_suite, engine):
    assert isinstance(sa_suite.db, EngineDatabase) and sa_suite.db.engine is engine


def test_a_send_in_session_begin_is_written_in_its_transaction_and_published_after_commit(
        sa_suite, engine, broker, charge):
    with Session(engine) as session, session.begin():
        session.add(Order(name="o1"))
        message = charge.send("o1")
        assert message.message_id not in published(broker)
        seen = session.connection().exec_driver_sql(
            "SELECT status FROM dramatiq_unique_jobs WHERE message_id = %(id)s", {"id": message.message_id}).scalar()
        assert seen == "pending"  # in the session's transaction
        with Session(engine) as other:  # not yet committed: another connection sees no row
            assert other.connection().exec_driver_sql("SELECT count(*) FROM dramatiq_unique_jobs").scalar() == 0
    assert published(broker) == {message.message_id}
    assert job_of(message).status == "queued"


def test_a_rollback_publishes_nothing_and_leaves_no_row(sa_suite, engine, broker, charge):
    with pytest.raises(RuntimeError), Session(engine) as session, session.begin():
        session.add(Order(name="o2"))
        message = charge.send("o2")
        raise RuntimeError
    assert dramatiq_unique.get_job(message.message_id) is None
    assert published(broker) == set()
    with Session(engine) as session:
        assert session.scalars(select(Order)).all() == []


def test_a_rolled_back_savepoint_drops_its_sends(sa_suite, engine, broker, charge):
    untracked = dramatiq.actor(lambda order: order, actor_name="untracked")
    with Session(engine) as session, session.begin():
        kept = charge.send("kept")
        with pytest.raises(RuntimeError), session.begin_nested():
            dropped = charge.send("dropped")
            dropped_untracked = untracked.send("dropped")
            with session.begin_nested():
                dropped_inner = charge.send("dropped-inner")
            raise RuntimeError
        with session.begin_nested():
            released = charge.send("released")
        nested = session.begin_nested()
        rolled = charge.send("rolled")
        nested.rollback()
    assert published(broker) == {kept.message_id, released.message_id}
    for message in (dropped, dropped_inner, rolled):
        assert dramatiq_unique.get_job(message.message_id) is None
    assert dropped_untracked.message_id not in published(broker)


def test_outside_a_session_transaction_a_send_is_published_at_once(sa_suite, engine, broker, charge):
    with Session(engine) as session:
        session.add(Order(name="autobegun"))  # an autobegun transaction is not followed: only session.begin()
        message = charge.send("o3")
        assert published(broker) == {message.message_id}
        session.rollback()
    assert job_of(message).status == "queued"


def test_transaction_with_a_session_joins_its_autobegun_transaction_until_its_commit(sa_suite, engine, broker, charge):
    """The common 2.0 shape, ``with Session(engine) as session: ...; session.commit()``: inside
    ``transaction(session=session)`` the sends are written in the session's transaction and published
    after its commit, which may come after the block."""
    with Session(engine) as session:
        session.add(Order(name="auto"))
        with dramatiq_unique.transaction(session=session) as joined:
            assert joined is session
            message = charge.send("auto")
        assert message.message_id not in published(broker)
        seen = session.connection().exec_driver_sql(
            "SELECT status FROM dramatiq_unique_jobs WHERE message_id = %(id)s", {"id": message.message_id}).scalar()
        assert seen == "pending"  # in the session's transaction
        outside = charge.send("outside")  # after the block: published at once, as without it
        assert published(broker) == {outside.message_id}
        session.commit()
    assert published(broker) == {message.message_id, outside.message_id}
    assert job_of(message).status == "queued"
    with Session(engine) as session:
        assert session.scalar(select(Order.name).where(Order.name == "auto")) == "auto"


def test_transaction_with_a_session_drops_the_sends_of_a_rollback_or_a_close_without_commit(
        sa_suite, engine, broker, charge):
    with Session(engine) as session:
        with dramatiq_unique.transaction(session=session):
            rolled = charge.send("rolled")
        session.rollback()
    with Session(engine) as session:
        with dramatiq_unique.transaction(session=session):
            closed = charge.send("closed")
            with pytest.raises(RuntimeError), session.begin_nested():
                charge.send("savepoint")
                raise RuntimeError
    assert published(broker) == set()
    for message in (rolled, closed):
        assert dramatiq_unique.get_job(message.message_id) is None


def test_transaction_with_a_session_follows_each_transaction_the_block_sees(sa_suite, engine, broker, charge):
    """A commit inside the block publishes what was held; the next send joins the session's next
    (autobegun) transaction and goes out with its commit."""
    with Session(engine) as session, dramatiq_unique.transaction(session=session):
        first = charge.send("first")
        session.commit()
        assert published(broker) == {first.message_id}
        second = charge.send("second")
        assert published(broker) == {first.message_id}
        session.commit()
    assert published(broker) == {first.message_id, second.message_id}


def test_transaction_with_a_session_needs_the_suite_set_up_on_an_engine(engine, broker, pg_url, key_prefix):
    suite = dramatiq_unique.setup(broker, database=pg_url, redis=REDIS_URL, key_prefix=key_prefix, redriver=False)
    try:
        with pytest.raises(dramatiq_unique.InvalidOption, match="database=engine"), Session(engine) as session:
            with dramatiq_unique.transaction(session=session):
                pass
    finally:
        suite.db.close()


def test_transaction_with_a_session_of_another_engine_is_refused(sa_suite, pg_url):
    other = create_engine(pg_url.replace("postgresql://", "postgresql+psycopg2://"))
    try:
        with pytest.raises(dramatiq_unique.InvalidOption, match="session=") as refused, Session(other) as session:
            with dramatiq_unique.transaction(session=session):
                pass
        assert "engine given to setup()" in str(refused.value)
    finally:
        other.dispose()


def test_dramatiq_uniques_transaction_block_inside_a_session_is_a_savepoint(sa_suite, engine, broker, charge):
    with Session(engine) as session, session.begin():
        with dramatiq_unique.transaction():
            message = charge.send("block")
        assert message.message_id not in published(broker)
    assert published(broker) == {message.message_id}


def test_a_broker_down_at_commit_leaves_the_job_pending_for_the_redrive(engine, key_prefix):
    server = RedisServer().start()
    broker = RedisBroker(url=server.url, namespace=f"{key_prefix}-down")
    dramatiq.set_broker(broker)
    suite = dramatiq_unique.setup(broker, database=engine, redis=REDIS_URL, key_prefix=key_prefix, redriver=False)
    try:
        @dramatiq.actor(track=True)
        def charge(order: str) -> str:
            return order

        with Session(engine) as session, session.begin():
            session.add(Order(name="down"))
            message = charge.send("down")
            server.stop()
        assert job_of(message).status == "pending"
        server.start()
        assert dramatiq_unique.redrive().sent == 1
        with running_worker(broker):
            wait_until(lambda: job_of(message).status == "succeeded", timeout=10)
    finally:
        server.stop()
        broker.close()
        suite.db.close()


@pytest.mark.parametrize("joined", ["begin", "transaction(session=...)"])
def test_two_racing_requests_make_one_job(sa_suite, engine, broker, joined):
    @dramatiq.actor(unique_args=["order"], unique_lock="until_executed")
    def invoice(order: str) -> str:
        return order

    def request(name: str, sent) -> str:
        with Session(engine) as session:
            if joined == "begin":
                with session.begin():
                    session.add(Order(name=name))
                    message = invoice.send("order-7")
                    sent()
            else:
                session.add(Order(name=name))
                with dramatiq_unique.transaction(session=session):
                    message = invoice.send("order-7")
                sent()
                session.commit()
        return message.message_id

    results = race(request)
    assert results["a"] == results["b"]
    assert JobModel.select().where((JobModel.actor_name == "invoice") & (JobModel.app == sa_suite.app)).count() == 1
    assert published(broker) == {results["a"]}


def test_a_sessionmakers_begin_is_followed_too(sa_suite, engine, broker, charge):
    from sqlalchemy.orm import sessionmaker

    session_local = sessionmaker(engine)
    with pytest.raises(RuntimeError), session_local.begin() as session:
        session.add(Order(name="sm-rolled"))
        rolled = charge.send("sm-rolled")
        raise RuntimeError
    with session_local.begin() as session:
        session.add(Order(name="sm"))
        message = charge.send("sm")
        assert published(broker) == set()
    assert published(broker) == {message.message_id}
    assert dramatiq_unique.get_job(rolled.message_id) is None
