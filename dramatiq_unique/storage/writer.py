"""Group commit: the writes that threads of one process make at once, as one statement and one commit.

A thread that finds no batch in flight writes at once, its own statement as it would alone.  Threads that
arrive while one is in flight queue; when it commits, the first of them leads the next batch, which takes
every queued request whose keys (its row, its fencing key) no request of the batch has: one statement of
one row per key, so each sees the rows as a statement of its own would.  A request kept out waits for the
batch after.  A queued thread waits at most :data:`WAIT_MS` for a batch to take it, then writes alone.

A batch answers each request with its verdict, or with :data:`ALONE`: the thread then runs its own
statement, so a batch that failed (a deadlock, a timeout, a lost server) raises in each thread what its
own statement raises (docs/discussions/how-it-is-built.md, "The writer").
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Hashable, Optional, Sequence

import peewee as pw

from dramatiq_unique.storage.database import is_postgres

logger = logging.getLogger(__name__)

#: ms a queued request waits for a batch to take it before its thread writes alone.
WAIT_MS = 1.0
#: Requests one batch takes at most.
MAX_ROWS = 64

#: A verdict: the thread runs its own statement.
ALONE: Any = object()

#: Writes a batch: each request's verdict, in order.
Batch = Callable[[list[Any]], Sequence[Any]]


class _Raised:
    """A verdict that is an error: the single statement a batch of one ran raised it."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error


@dataclass(eq=False)
class _Slot:
    request: Any
    alone: Callable[[], Any]
    keys: tuple[Hashable, ...]
    #: A queued slot's: held until its batch committed, or it is to lead one (a lock costs less than an Event).
    gate: Any = None
    verdict: Any = ALONE
    #: In a batch: its thread no longer writes alone.
    taken: bool = False
    #: Set on the slot whose thread leads this batch.
    batch: Optional[list["_Slot"]] = None


@dataclass
class Tally:
    """What a writer did: batches of two or more requests written, their rows, batches that failed, and
    requests written by their own statement (alone, or after their wait)."""

    batches: int = 0
    rows: int = 0
    failed: int = 0
    alone: int = 0
    #: The longest a queued request waited for its batch to begin, in ms.
    max_wait_ms: float = 0.0


class Writer:
    """The group commit of one kind of write to one job table (see the module docstring)."""

    def __init__(self, *, batch: Batch, keys: Callable[[Any], tuple[Hashable, ...]],
                 wait_ms: Optional[float] = None, max_rows: int = MAX_ROWS) -> None:
        self.batch = batch
        self.keys = keys
        #: None: :data:`WAIT_MS`, read at each wait.
        self.wait_ms = wait_ms
        self.max_rows = max_rows
        self.tally = Tally()
        self._lock = threading.Lock()
        self._queue: list[_Slot] = []
        self._busy = False

    def write(self, request: Any, alone: Callable[[], Any]) -> Any:
        """``request``'s verdict, from a batch or from ``alone()``, its own statement."""
        slot = _Slot(request, alone, self.keys(request))
        with self._lock:
            lead = not self._busy
            self._busy = True
            if lead:
                slot.taken, slot.batch = True, [slot]
            else:
                slot.gate = threading.Lock()
                slot.gate.acquire()
                self._queue.append(slot)
        if not lead:
            self._follow(slot)
        if slot.batch is not None:
            self._lead(slot.batch)
        verdict = slot.verdict
        if isinstance(verdict, _Raised):
            raise verdict.error
        return alone() if verdict is ALONE else verdict

    def _follow(self, slot: _Slot) -> None:
        began = time.monotonic()
        try:
            if not slot.gate.acquire(timeout=(WAIT_MS if self.wait_ms is None else self.wait_ms) / 1000):
                with self._lock:
                    if not slot.taken:  # no batch took it in time: it writes alone
                        self._queue.remove(slot)
                        self.tally.alone += 1
                        return
                slot.gate.acquire()
        except BaseException:  # an asynchronous exception (a time limit): its batch must still run
            with self._lock:
                if not slot.taken:
                    self._queue.remove(slot)
                    raise
            if slot.batch is not None:
                self._lead(slot.batch)
            raise
        if slot.batch is not None:
            self.tally.max_wait_ms = max(self.tally.max_wait_ms, (time.monotonic() - began) * 1000)

    def _lead(self, batch: list[_Slot]) -> None:
        try:
            if len(batch) == 1:  # alone: its own statement, at once
                self.tally.alone += 1
                try:
                    batch[0].verdict = batch[0].alone()
                except Exception as e:
                    batch[0].verdict = _Raised(e)
            else:
                try:
                    verdicts = self.batch([slot.request for slot in batch])
                    self.tally.batches += 1
                    self.tally.rows += len(batch)
                except Exception:
                    # Each thread runs its own statement, and meets its own error, if any.
                    logger.debug("A batch of %d writes failed; each is written alone.", len(batch), exc_info=True)
                    verdicts = [ALONE] * len(batch)
                    self.tally.failed += 1
                for slot, verdict in zip(batch, verdicts, strict=True):
                    slot.verdict = verdict
        finally:
            nxt = self._hand_over()
            for slot in batch[1:]:
                slot.gate.release()
            if nxt:
                nxt[0].gate.release()

    def _hand_over(self) -> list[_Slot]:
        """The next batch, its leader (its first slot) named; the writer idle if none is queued."""
        with self._lock:
            taken: list[_Slot] = []
            seen: set[Hashable] = set()
            for slot in self._queue:
                if len(taken) == self.max_rows:
                    break
                if seen.isdisjoint(slot.keys):
                    taken.append(slot)
                seen.update(slot.keys)  # a later request of a kept-out key keeps its turn behind it
            if not taken:
                self._busy = False
                return taken
            kept = set(map(id, taken))
            self._queue = [slot for slot in self._queue if id(slot) not in kept]
            for slot in taken:
                slot.taken = True
            taken[0].batch = taken
            return taken


def groupable(db: pw.Database) -> bool:
    """Whether writes on ``db`` may be group-committed: PostgreSQL, on peewee's own per-thread connection
    (not a framework's, which serves its transactions), outside a transaction (a write in one commits
    with it)."""
    return is_postgres(db) and type(db).connection is pw.Database.connection and not db.in_transaction()


_writers: "weakref.WeakKeyDictionary[Any, dict[str, Writer]]" = weakref.WeakKeyDictionary()
_made = threading.Lock()


def _forget() -> None:
    """In a forked child: fresh writers, as a lock another thread of the parent held stays held there."""
    global _made
    _made = threading.Lock()
    _writers.clear()


os.register_at_fork(after_in_child=_forget)


def of(model: Any, kind: str, make: Callable[[], Writer]) -> Writer:
    """The writer of ``kind`` for ``model``'s table, made by ``make`` the first time."""
    found = _writers.get(model, {}).get(kind)
    if found is None:
        with _made:
            found = _writers.setdefault(model, {}).get(kind)
            if found is None:
                found = _writers[model][kind] = make()
    return found
