"""What a transaction holds for its commit (the outbox's sends), kept as the database keeps the
transaction's writes: a savepoint rolled back drops what was held in it, which peewee's ``after_commit``
alone would not (docs/discussions/how-it-is-built.md, "Storage")."""

from __future__ import annotations

import dataclasses
import logging
import re
from typing import Any, Callable, Optional

import peewee as pw

logger = logging.getLogger(__name__)

#: Takes the items one transaction held with it, after that transaction committed.
Flush = Callable[[list[Any]], None]

#: Set on a Database that :func:`track` wrapped; the journal's attribute on its per-thread state.
_TRACKED = "_dramatiq_unique_savepoints"
_JOURNAL = "_dramatiq_unique_journal"

_NAME = r'(?P<name>"(?:[^"]|"")+"|\w+)'
_SAVEPOINT = re.compile(rf"\s*SAVEPOINT\s+{_NAME}\s*;?\s*$", re.IGNORECASE)
_RELEASE = re.compile(rf"\s*RELEASE\s+(?:SAVEPOINT\s+)?{_NAME}\s*;?\s*$", re.IGNORECASE)
_ROLLBACK_TO = re.compile(rf"\s*ROLLBACK\s+(?:(?:TRANSACTION|WORK)\s+)?TO\s+(?:SAVEPOINT\s+)?{_NAME}\s*;?\s*$",
                          re.IGNORECASE)
_ROLLBACK = re.compile(r"\s*(?:ROLLBACK|ABORT)(?:\s+(?:TRANSACTION|WORK))?\s*;?\s*$", re.IGNORECASE)
#: How the statements above begin: any other statement costs one test.
_HEADS = frozenset(("SA", "RE", "RO", "AB"))


@dataclasses.dataclass(eq=False)
class _Journal:
    """What one thread's transaction on one Database holds for its commit, and its savepoints' marks."""

    entries: list[tuple[Flush, Any]] = dataclasses.field(default_factory=list)
    #: (savepoint name, the journal's length when it began), oldest first.
    marks: list[tuple[str, int]] = dataclasses.field(default_factory=list)
    #: Its commit() waits among peewee's commit callbacks.
    registered: bool = False
    closed: bool = False

    def commit(self) -> None:
        """After the transaction committed: each flush gets its items, in order.  Never raises: peewee
        would take an error here for a failed commit and roll back a transaction that committed."""
        if self.closed:
            return
        self.closed = True
        entries, self.entries = self.entries, []
        groups: dict[Flush, list[Any]] = {}
        for flush, item in entries:
            groups.setdefault(flush, []).append(item)
        for flush, items in groups.items():
            try:
                flush(items)
            except Exception:
                logger.exception("Could not hand %d items over after a commit.", len(items))

    def drop(self) -> None:
        """The transaction rolled back: nothing it held is handed over (its commit callback, should
        peewee still run it, does nothing)."""
        self.closed = True
        self.entries = []
        self.marks = []

    def savepoint(self, name: str) -> None:
        self.marks.append((name, len(self.entries)))

    def release(self, name: str) -> None:
        at = self._find(name)
        if at is not None:
            del self.marks[at:]

    def roll_back_to(self, name: str) -> None:
        at = self._find(name)
        # A savepoint the journal never saw began before anything it holds (the journal is made at
        # the transaction's first savepoint or hold): all of it goes.
        kept = self.marks[at][1] if at is not None else 0
        if at is not None:
            del self.marks[at + 1:]
        del self.entries[kept:]

    def _find(self, name: str) -> Optional[int]:
        # The newest savepoint of that name, as the database picks it.
        return next((at for at in reversed(range(len(self.marks))) if self.marks[at][0] == name), None)


def _journal(db: pw.Database, *, create: bool) -> Optional[_Journal]:
    state = db._state  # type: ignore[attr-defined]  # peewee's per-thread state: its commit callbacks
    journal: Optional[_Journal] = getattr(state, _JOURNAL, None)
    if journal is not None and (
        journal.closed or (journal.registered and journal.commit not in state.commit_callbacks)
    ):  # committed, or its commit passed it by (a callback before it raised; the connection was reset)
        journal = None
    if journal is None and create:
        journal = _Journal()
        setattr(state, _JOURNAL, journal)
    return journal


def _end(db: pw.Database) -> None:
    journal: Optional[_Journal] = getattr(db._state, _JOURNAL, None)  # type: ignore[attr-defined]
    if journal is not None:
        journal.drop()  # closed: the next hold makes another


def hold(db: pw.Database, flush: Flush, item: Any) -> None:
    """Keep ``item`` until this thread's transaction on ``db`` commits, then hand it to ``flush`` (with
    the other items held for the same flush); never, if the savepoint or transaction it was held in
    rolls back.  ``db`` must be :func:`track`-ed and in a transaction."""
    own = getattr(db, "hold", None)
    if own is not None and own(flush, item):  # in a framework's transaction (dramatiq_unique.contrib), held there
        return
    if not getattr(db, _TRACKED, False):
        raise RuntimeError(f"{db!r} does not follow savepoints: open it with storage.database.open_database")
    if not db.in_transaction():
        raise RuntimeError("hold() outside a transaction: nothing would tell it a commit from a rollback")
    journal = _journal(db, create=True)
    assert journal is not None
    if not journal.registered:
        db.after_commit(journal.commit)
        journal.registered = True
    journal.entries.append((flush, item))


def _name(quoted: str) -> str:
    # As the database compares them: a quoted name as written, a bare one in any case.
    if quoted.startswith('"'):
        return quoted[1:-1].replace('""', '"')
    return quoted.lower()


#: How the journal follows a statement that moves a savepoint: (pattern, the journal's method, whether the
#: statement makes the journal).
_MOVES = ((_SAVEPOINT, "savepoint", True), (_RELEASE, "release", False), (_ROLLBACK_TO, "roll_back_to", False))


def _follow(db: pw.Database, sql: str, *, failed: bool) -> None:
    """The journal follows ``sql``, which ``db`` ran (``failed``: with an error), if it moves a savepoint.
    A failed ROLLBACK TO still ends what the savepoint held: the transaction cannot commit it."""
    for pattern, method, create in _MOVES:
        match = pattern.match(sql)
        if match:
            journal = _journal(db, create=create) if not failed or method == "roll_back_to" else None
            if journal is not None:
                getattr(journal, method)(_name(match["name"]))
            return
    if not failed and _ROLLBACK.match(sql):
        _end(db)


def track(db: pw.Database) -> pw.Database:
    """Make ``db`` tell :func:`hold`'s journal of its savepoints and transactions, in place; returns it."""
    if getattr(db, _TRACKED, False):
        return db
    execute_sql, rollback, begin = db.execute_sql, db.rollback, db.begin

    def tracking_execute_sql(sql: Any, *args: Any, **kwargs: Any) -> Any:
        if not isinstance(sql, str) or (sql[:2].upper() not in _HEADS and not sql[:1].isspace()):
            return execute_sql(sql, *args, **kwargs)
        try:
            cursor = execute_sql(sql, *args, **kwargs)
        except BaseException:
            _follow(db, sql, failed=True)
            raise
        _follow(db, sql, failed=False)
        return cursor

    def tracking_rollback(*args: Any, **kwargs: Any) -> Any:
        try:
            return rollback(*args, **kwargs)
        finally:
            _end(db)

    def tracking_begin(*args: Any, **kwargs: Any) -> Any:
        _end(db)  # a new transaction holds nothing yet, whatever the last one left
        return begin(*args, **kwargs)

    db.execute_sql = tracking_execute_sql  # type: ignore[method-assign]
    db.rollback = tracking_rollback  # type: ignore[method-assign]
    db.begin = tracking_begin  # type: ignore[method-assign]
    setattr(db, _TRACKED, True)
    return db
