"""The job tables beside an SQLAlchemy engine (``setup(broker, database=engine)``, a sync PostgreSQL one).

The suite opens its own connections from the engine's URL; while a Session bound to it is in a transaction
begun with ``session.begin()`` in this thread or task, or inside ``transaction(session=...)`` whatever began
its transaction, the suite's statements run in that transaction, and what the outbox holds follows the
session's savepoints and is published after its commit."""

from __future__ import annotations

import contextlib
import contextvars
import weakref
from typing import Any, Iterator, Optional

from sqlalchemy import event
from sqlalchemy.orm import Session, SessionTransaction, SessionTransactionOrigin

from dramatiq_unique.contrib import FrameworkDatabase
from dramatiq_unique.errors import InvalidOption
from dramatiq_unique.storage.database import ReconnectingPostgresqlDatabase, postgres
from dramatiq_unique.storage.savepoints import Flush, _Journal
from dramatiq_unique.suite import Settings

#: The sessions of this thread or task in a ``session.begin()`` transaction, with their engines.
_sessions: contextvars.ContextVar[tuple[tuple[Any, Session], ...]] = contextvars.ContextVar(
    "dramatiq_unique_sessions", default=())
#: The sessions this thread or task follows in ``dramatiq_unique.transaction(session=...)``, with their engines.
_followed: contextvars.ContextVar[tuple[tuple[Any, Session], ...]] = contextvars.ContextVar(
    "dramatiq_unique_followed", default=())
#: The engines set up, with their databases.
_engines: "weakref.WeakKeyDictionary[Any, EngineDatabase]" = weakref.WeakKeyDictionary()
#: Where a session's journal is kept (``session.info``, and its connection's ``info`` for the savepoint events).
_KEY = "dramatiq_unique_journal"


class EngineDatabase(FrameworkDatabase, ReconnectingPostgresqlDatabase):
    """The job tables in an SQLAlchemy engine's PostgreSQL database, in its sessions' transactions."""

    engine: Any = None

    @classmethod
    def of(cls, engine: Any) -> "EngineDatabase":
        if engine.dialect.name != "postgresql" or not hasattr(engine, "raw_connection"):
            raise InvalidOption(f"database=engine needs a sync PostgreSQL engine, not {engine!r}")
        url = engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
        db = postgres(url, Settings.database_connect_timeout, Settings.database_timeout, cls,
                      prefer_psycopg3=engine.dialect.driver == "psycopg")
        db.engine = engine
        if engine not in _engines:
            for name, listener in _LISTENERS.items():
                event.listen(engine, name, listener)
        _engines[engine] = db
        return db

    def _session(self) -> Optional[Session]:
        for engine, session in reversed((*_followed.get(), *_sessions.get())):
            if engine is self.engine:
                return session
        return None

    def connection(self) -> Any:
        session = self._session()
        return super().connection() if session is None else session.connection().connection.driver_connection

    def cursor(self, named_cursor: Any = None) -> Any:
        return super().cursor() if self._session() is None else self.connection().cursor()

    def in_transaction(self) -> bool:
        return self._session() is not None or super().in_transaction()

    def atomic(self, *args: Any, **kwargs: Any) -> Any:
        session = self._session()
        return super().atomic(*args, **kwargs) if session is None else session.begin_nested()

    @contextlib.contextmanager
    def following(self, session: Session) -> Iterator[Session]:
        """While the block runs, the suite's statements run in ``session``'s transaction, begun (autobegin)
        if it has none, and the sends are published after that transaction's commit, dropped at its
        rollback (``dramatiq_unique.transaction(session=...)``)."""
        if _engine_of(session) is not self.engine:
            raise InvalidOption("transaction(session=...) needs a session bound to the engine given to setup()")
        token = _followed.set((*_followed.get(), (self.engine, session)))
        try:
            yield session
        finally:
            _followed.reset(token)

    def hold(self, flush: Flush, item: Any) -> bool:
        """Keep ``item`` for ``flush`` after the session's commit (storage/savepoints.py's ``hold``);
        False outside a session's transaction (peewee's own journal keeps it)."""
        session = self._session()
        if session is None:
            return False
        journal = session.info.get(_KEY)
        if journal is None:
            journal = session.info[_KEY] = session.connection().info[_KEY] = _Journal()
        journal.entries.append((flush, item))
        return True


@event.listens_for(Session, "after_transaction_create")
def _began(session: Session, transaction: SessionTransaction) -> None:
    if transaction.parent is None and transaction.origin is SessionTransactionOrigin.BEGIN:
        engine = _engine_of(session)
        if engine is not None:
            _sessions.set((*_sessions.get(), (engine, session)))


def _engine_of(session: Session) -> Any:
    """The engine given to ``setup()`` that ``session`` is bound to, or None."""
    try:
        bind = session.get_bind()
    except Exception:  # noqa: BLE001 - several binds and no mapper to choose: not one of ours
        return None
    engine = getattr(bind, "engine", bind)
    return engine if engine in _engines else None


@event.listens_for(Session, "after_transaction_end")
def _ended(session: Session, transaction: SessionTransaction) -> None:
    if transaction.parent is None:
        _sessions.set(tuple(pair for pair in _sessions.get() if pair[1] is not session))
        _drop(session.info)  # rolled back, if it is still there (a commit takes it first)


@event.listens_for(Session, "after_commit")
def _committed(session: Session) -> None:
    root = session.get_transaction()
    if root is not None and root.is_active:
        return  # a savepoint's release (SQLAlchemy calls it a commit too): the transaction goes on
    journal = session.info.pop(_KEY, None)
    if journal is not None:
        # The claims run on the suite's own connection: the session's transaction is done.
        sessions, followed = _sessions.set(()), _followed.set(())
        try:
            journal.commit()
        finally:
            _sessions.reset(sessions)
            _followed.reset(followed)


def _on_after_cursor_execute(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
    # Its name, which the savepoint event does not give yet.
    journal = conn.info.get(_KEY)
    if journal is not None and statement.startswith("SAVEPOINT "):
        journal.savepoint(statement[10:].strip())


def _following(method: str) -> Any:
    """A savepoint event's listener: the connection's journal does ``method`` with the savepoint's name."""
    def listener(conn: Any, name: str, context: Any) -> None:
        journal = conn.info.get(_KEY)
        if journal is not None:
            getattr(journal, method)(name)
    return listener


def _drop(info: dict) -> None:
    journal = info.pop(_KEY, None)
    if journal is not None:
        journal.drop()


_LISTENERS = {
    "after_cursor_execute": _on_after_cursor_execute,
    "release_savepoint": _following("release"),
    "rollback_savepoint": _following("roll_back_to"),
    "commit": lambda conn: conn.info.pop(_KEY, None),  # the session's after_commit publishes it
    "rollback": lambda conn: _drop(conn.info),
}
