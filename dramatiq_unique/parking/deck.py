"""On deck: the next jobs of a busy slot group, reserved ahead by the process whose holder runs.

When a holder here leaves, the first row on deck is started by a compare-and-set on what its
reservation read, then handed the slot and delivered in one Redis call: one commit and one Redis
call on a hand-over's critical path.  What stays bounded: docs/discussions/how-it-is-built.md.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from typing import TYPE_CHECKING, Any, Optional, Protocol

from dramatiq_unique.durable.messages import rebuild
from dramatiq_unique.locks.redlock import new_token
from dramatiq_unique.parking.gates import WAKE, reservation
from dramatiq_unique.storage import jobs
from dramatiq_unique.storage.models import JobModel, JobStatus

if TYPE_CHECKING:
    from dramatiq_unique.broker.delivery import Delivery
    from dramatiq_unique.parking.gates import Gate, GroupInfo
    from dramatiq_unique.suite import Suite

logger = logging.getLogger(__name__)

#: Rows on deck per group and process: two, so that two holders of a group here that
#: finish together both hand over in one step.
DEPTH = 2
#: ms a reserved row may wait on deck before the watchdog puts it back in the queue (at
#: most half the group's slot lease, the length of a reservation in the database: so a
#: killed process's rows are free about when its slots are).
MAX_WAIT_MS = 2_000


class Waker(Protocol):
    """What the deck uses of the :class:`~dramatiq_unique.parking.lot.Parking` it serves (named here:
    parking imports the deck)."""

    suite: "Suite"
    delivery: "Delivery"
    started: Any  # lot.Started
    wakeups: Any  # lot.Flags

    def wake(self, gate: "Gate", group: str) -> Optional[JobModel]: ...

    def wake_if_flagged(self, gate: "Gate", group: str) -> Optional[JobModel]: ...


class OnDeck:
    """The rows on deck of one :class:`~dramatiq_unique.parking.lot.Parking`, by group."""

    def __init__(self, parking: Waker) -> None:
        self.parking = parking
        #: Reserve the next jobs ahead of time (see the module's docs).
        self.enabled = True
        self.places = Places()

    @property
    def marker(self) -> str:
        """The ``worker`` value of the rows this process reserved."""
        return f"{self.parking.suite.worker_id}:deck"

    # -- reserving -------------------------------------------------------------

    def fill(
        self, gate: "Gate", group: str, *, since: Optional[float] = None, place: Optional[tuple] = None,
    ) -> None:
        """Reserve ``group``'s next parked rows, up to ``DEPTH`` on deck: after a hand-over that woke a
        job of the group here (``since``: when it began), or after a job parked on it while a holder runs
        here (``place``: its ``(created_at, process_after, id)``, which may take the last row's place).
        A row that raced a holder here letting its slot go after ``since`` is put back, the group woken."""
        if not self.enabled or getattr(gate, "pass_and_deliver", None) is None:
            return
        delivery = self.parking.delivery
        if not delivery.local or delivery.worker is None:
            return
        began = time.monotonic() if since is None else since
        info = gate.describe(group)
        if info is None or info.start is None or info.start.release_hold:
            return  # its start would take more than this module writes
        late = None if place is None else place_of(info.order_by, *place)
        while True:
            if not self.places.book(group, with_holder=since is None, late=late):
                return
            late = None
            rows: list[JobModel] = []
            try:
                row = jobs.reserve(
                    info.model, group, info.order_by, self.marker, info.ttl_ms, app=self.parking.suite.app
                )
                rows = [] if row is None else [row]
            finally:
                kept = self._settle(gate, group, info, rows, began, booked=1)
            if not kept:
                return

    def _settle(
        self, gate: "Gate", group: str, info: "GroupInfo", rows: list[JobModel], began: float, booked: int,
    ) -> bool:
        """Put freshly reserved rows on deck (``booked`` places were counted for them); True if
        all were kept.  Those that cannot stay (see :meth:`fill`) are put back."""
        back, raced = self.places.settle(group, info, rows, began, booked)
        for row in back:
            self.put_back(info, row, group)
        if raced and back:
            self.parking.wake_if_flagged(gate, group)  # a slot may be free for them
        return bool(rows) and not back

    # -- handing over ----------------------------------------------------------

    def hand_over(self, gate: "Gate", group: str, token: str, since: Optional[float] = None) -> Optional[JobModel]:
        """Holding ``group``'s slot under ``token``: start the first row on deck, then pass it the slot and
        deliver it in one Redis call, then reserve the next rows; the started row.  None (the caller goes
        on the usual way) if none is on deck, it is no longer ours as reserved, or the pass failed."""
        began = time.monotonic() if since is None else since
        first = self.places.take_first(group)  # with the places left on deck, booked now (see fill())
        if first is None:
            return None
        deck, booked = first
        parking, row, info = self.parking, deck.row, deck.info
        assert info.start is not None
        started = None
        if (time.monotonic() - deck.since) * 1000 < max_wait(info):  # else its reservation may be running out
            try:  # verified and started before anything is delivered: a stale reservation starts nothing
                started = jobs.start_reserved(
                    info.model, row, self.marker, f"{parking.suite.worker_id}:woken", info.start.lease_ms
                )
            except Exception:
                logger.exception("Could not start job %s, on deck.", row.message_id)
        if started is None:
            logger.debug("Job %s, on deck, changed, was taken or waited too long: not handed over.", row.message_id)
            self._settle(gate, group, info, [], began, booked)
            self.put_back(info, row, group)  # cleared if still ours (replaced, say), the group flagged
            return None
        fresh = new_token()
        wake = reservation(group, fresh, parking.suite.worker_id)
        passed, plan = False, None
        try:
            # Built from the row as the start returned it: the database's arguments, not the deck's copy.
            plan = parking.delivery.plan(rebuild(started, {WAKE: wake}), started.broker_ref)
            if plan is not None:
                parking.started.put(started)
                passed = gate.pass_and_deliver(  # type: ignore[attr-defined]
                    group, token, fresh, info.ttl_ms, plan.keys, plan.args
                )
        except Exception:
            logger.exception("Could not hand %s to job %s, on deck.", group, row.message_id)
        if not passed or plan is None:
            parking.started.take(started.message_id, started.revision)
            self._settle(gate, group, info, [], began, booked)
            self.put_back(info, row, group, started)
            return None
        plan.complete()
        time.sleep(0)  # yield the GIL: the woken job's thread goes first, the next reservations after
        refilled: list[JobModel] = []
        try:
            refilled = reserve_many(info, group, self.marker, booked, app=parking.suite.app)
        except Exception:
            logger.exception("Could not reserve the next jobs of %s.", group)
        finally:
            self._settle(gate, group, info, refilled, began, booked)
        logger.debug("Handed %s to job %s, on deck.", group, row.message_id)
        return started

    def released(self, gate: "Gate", group: str) -> None:
        """A holder of ``group`` here left without handing its slot on (nobody was waiting,
        or it had lost the slot).  A row reserved meanwhile would wait for nobody: wake it."""
        if not self.enabled or getattr(gate, "pass_and_deliver", None) is None:
            return  # a gate without a deck (an execution lock): nothing to note on every leave
        if self.places.released(group):
            self.parking.wake(gate, group)

    # -- giving back -----------------------------------------------------------

    def put_back(self, info: "GroupInfo", row: JobModel, group: str, started: Optional[JobModel] = None) -> None:
        """Clear a reservation (undo the row's start first: ``started``, not delivered): the row
        is an ordinary parked job again, and its group flagged."""
        model = info.model
        try:
            if started is not None:
                jobs.unstart(model, started, group)
            model.update(worker=None, lease_until=None).where(
                (model.id == row.id) & (model.status == JobStatus.PENDING.value) & (model.worker == self.marker)
            ).execute()
            self.parking.wakeups.flag(group, 0)
        except Exception:
            logger.exception("Could not clear the reservation of job %s; it ends by itself.", row.message_id)

    def sweep(self, max_wait_ms: Optional[float] = None) -> int:
        """Put back the rows that waited on deck too long (all of them with ``max_wait_ms=0``)."""
        stale = self.places.stale(max_wait_ms)
        for group, deck in stale:
            self.put_back(deck.info, deck.row, group)
        return len(stale)


def reserve_many(info: "GroupInfo", group: str, marker: str, count: int, *, app: str) -> list[JobModel]:
    """Up to ``count`` rows reserved for the group's slot lease, by the database's clock
    (:func:`~dramatiq_unique.storage.jobs.reserve`)."""
    rows: list[JobModel] = []
    for _ in range(count):
        found = jobs.reserve(info.model, group, info.order_by, marker, info.ttl_ms, app=app)
        if found is None:
            break
        rows.append(found)
    return rows


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
        """Count a place on deck for one reservation of ``group`` before it is made; False if none is left
        (``with_holder``: only while a holder of the group runs here).  ``late``: a job that just parked,
        which gets a place on a full deck if it comes before the last row (that one goes back)."""
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
