"""The places on deck of one process: which reserved rows wait here for a holder, by group.

Bookkeeping only, under one lock, with no database or Redis call: the
deck (:mod:`dramatiq_unique.parking.deck`) reserves, starts and puts back
rows; what it holds is counted here, so that

* a group never has more rows on deck here than :data:`DEPTH`: a place is
  *booked* before the statement that reserves a row runs, and *settled*
  when it returned;
* the rows on deck keep their queue's order (:func:`place_of`), a job that
  parked late but comes first taking the last one's place;
* a reservation that raced a holder here letting its slot go is caught
  (:meth:`Places.released` notes when, :meth:`Places.settle` looks);
* a row kept on deck longer than :func:`max_wait` is found (:meth:`Places.stale`).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import TYPE_CHECKING, Any, Optional

if TYPE_CHECKING:
    from dramatiq_unique.parking.gates import GroupInfo
    from dramatiq_unique.storage.models import JobModel

#: Rows on deck per group and process: two, so that two holders of a group here that
#: finish together both hand over in one step.
DEPTH = 2
#: ms a reserved row may wait on deck before the watchdog puts it back in the queue (at
#: most half the group's slot lease, the length of a reservation in the database: so a
#: killed process's rows are free about when its slots are).
MAX_WAIT_MS = 2_000


@dataclasses.dataclass
class Deck:
    """A row on deck: reserved for this process, waiting for a holder of its group here."""

    row: JobModel
    info: GroupInfo
    since: float  # monotonic seconds

    @property
    def key(self) -> tuple:
        return place_of(self.info.order_by, self.row.created_at, self.row.process_after, self.row.id)


def place_of(order_by: str, created_at: Any, process_after: Any, job_id: int) -> tuple:
    """A row's place in its group's queue (as the claim orders them)."""
    first = process_after if order_by == "process_after" and process_after is not None else created_at
    return (first, job_id)


def own_unique(row: JobModel) -> bool:
    """A message that brought unique options of its own starts the usual way, not from the deck."""
    return any(str(k).startswith("unique_") for k in (row.options or {}))


def max_wait(info: GroupInfo) -> float:
    """ms a row of a group with ``info`` may wait on deck."""
    return min(MAX_WAIT_MS, info.ttl_ms / 2)


class Places:
    """The places on deck of one process, by group.  Thread-safe."""

    def __init__(self) -> None:
        self._decks: dict[str, list[Deck]] = {}
        self._holders: dict[str, int] = {}
        self._coming: dict[str, int] = {}  # group: reservations under way
        self._missed: dict[str, float] = {}  # group: when a holder here last let its slot go
        self._missed_cap = 1000
        self._lock = threading.Lock()

    def book(self, group: str, *, with_holder: bool, late: Optional[tuple] = None) -> bool:
        """Count a place on deck for one reservation of ``group``, before it is made (so no
        more rows are claimed than there are places); False if there is none.

        ``with_holder``: only while a holder of the group runs here.  ``late``: the
        :func:`place_of` of a job that just parked; with the deck full, it still gets a place
        if it comes before the last row on deck (that row goes back when the reservation settles).
        """
        with self._lock:
            decks, coming = self._decks.get(group, []), self._coming.get(group, 0)
            if with_holder and group not in self._holders:
                return False
            if len(decks) + coming >= DEPTH:
                # Full: only a job that parked late, ahead of the last on deck, gets a place.
                if not (late is not None and not coming and decks and late < decks[-1].key):
                    return False
            self._coming[group] = coming + 1
            return True

    def settle(
        self, group: str, info: GroupInfo, rows: list[JobModel], began: float, booked: int,
    ) -> tuple[list[JobModel], bool]:
        """Put freshly reserved rows on deck (``booked`` places were counted for them).  Returns
        the rows that cannot stay, for the caller to put back, and whether a holder here let its
        slot go after ``began`` (it may have looked at the deck before these rows were on it)."""
        back: list[JobModel] = []
        with self._lock:
            left = self._coming.get(group, 0) - booked
            if left > 0:
                self._coming[group] = left
            else:
                self._coming.pop(group, None)
            raced = self._missed.get(group, 0.0) >= began
            for row in rows:
                if raced or own_unique(row):
                    back.append(row)
                    continue
                decks = self._decks.setdefault(group, [])
                decks.append(Deck(row, info, time.monotonic()))
                decks.sort(key=lambda d: d.key)
                if len(decks) > DEPTH:
                    back.append(decks.pop().row)
        return back, raced

    def take_first(self, group: str) -> Optional[tuple[Deck, int]]:
        """Take the first row on deck of ``group`` off it, and book the places then free on
        deck for its refill (see :meth:`book`): ``(deck, booked)``; None if there is none."""
        with self._lock:
            decks = self._decks.get(group)
            deck = decks.pop(0) if decks else None
            if decks == []:
                del self._decks[group]
            if deck is None:
                return None
            booked = max(DEPTH - len(self._decks.get(group, ())) - self._coming.get(group, 0), 0)
            if booked:
                self._coming[group] = self._coming.get(group, 0) + booked
            return deck, booked

    def released(self, group: str) -> bool:
        """Note that a holder of ``group`` here let its slot go now; whether rows wait on deck for it."""
        with self._lock:
            if len(self._missed) > self._missed_cap:  # only fills under way look: keep the recent ones
                cut = time.monotonic() - 60
                self._missed = {g: t for g, t in self._missed.items() if t > cut}
                self._missed_cap = max(1000, 2 * len(self._missed))  # so pruning stays rare
            self._missed[group] = time.monotonic()
            return bool(self._decks.get(group))

    def stale(self, max_wait_ms: Optional[float] = None) -> list[tuple[str, Deck]]:
        """Take off the deck the rows that waited too long (all of them with ``max_wait_ms=0``;
        :func:`max_wait` with None): ``(group, deck)`` pairs."""
        now = time.monotonic()
        stale: list[tuple[str, Deck]] = []

        def old(deck: Deck) -> bool:
            return (now - deck.since) * 1000 >= (max_wait(deck.info) if max_wait_ms is None else max_wait_ms)

        with self._lock:
            for group, decks in list(self._decks.items()):
                stale += [(group, d) for d in decks if old(d)]
                keep = [d for d in decks if not old(d)]
                if keep:
                    self._decks[group] = keep
                else:
                    del self._decks[group]
        return stale

    def holding(self, group: str, change: int) -> None:
        """Count a slot of ``group`` taken (+1) or left (-1) in this process."""
        with self._lock:
            count = self._holders.get(group, 0) + change
            if count > 0:
                self._holders[group] = count
            else:
                self._holders.pop(group, None)

    def busy(self, group: str) -> bool:
        """Whether rows of ``group`` wait on deck here."""
        return bool(self._decks.get(group))  # a read of one dict entry: no lock needed
