"""The next jobs of a busy slot group, reserved ahead of time ("on deck").

While a holder of a group runs here, the rows at the head of the group's
queue are *reserved* by this process, up to
:data:`~dramatiq_unique.parking.places.DEPTH` per group (``worker`` =
``<host>:<pid>:deck``, ``lease_until`` = the end of the reservation by
the database's clock, a fresh ``broker_ref``).  A reserved
row stays parked (``pending``, counted by ``concurrency_status()``);
other wakers skip it while its reservation lasts.

When a holder here leaves, the first row on deck is *started* in the
database by a compare-and-set on what its reservation read
(:func:`dramatiq_unique.storage.jobs.start_reserved`: still pending, reserved
by us under the same broker id, revision and fencing token; the start
draws the next token).  Only then are the slot passed to it and its
message, rebuilt from the row the start returned, written for this
worker, in one Redis script
(:meth:`~dramatiq_unique.slots.gate.SlotGate.pass_and_deliver`).  A row
replaced while on deck (``unique_on_conflict="replace"``) or taken by
another process (this one stalled past the reservation, or the other's
clock runs ahead) fails the compare-and-set: nothing is delivered from
the deck, the row goes back to the queue the usual way, and no fencing
token goes to two attempts.  A start whose slot cannot be passed is
undone (:func:`~dramatiq_unique.storage.jobs.unstart`).  The next rows are
reserved after the delivery: one synchronous commit and one Redis call
on the critical path of a hand-over.

What stays bounded:

* FIFO order: a reserved row waits for a holder *in this process*; a
  holder in another process that leaves meanwhile wakes the next
  unreserved row.  At most :data:`~dramatiq_unique.parking.places.DEPTH`
  jobs per group and process are overtaken so.
* A row on deck for longer than
  :func:`~dramatiq_unique.parking.places.max_wait` (its holder runs a
  long job) goes back to the queue (the watchdog looks), as do all rows
  on deck when the worker stops, and one that cannot be handed over.
* A process killed with rows on deck leaves them reserved as long as the
  group's slot lease (``concurrency_ttl``): a waker that finds only
  reserved rows flags the group for a look when the first runs out.

Only for an actor without an execution lock whose start releases no
unique hold, a row whose message brought no unique options of its own,
and while the woken jobs go to this process's own worker.

What is on deck here, and how many places are left, is counted in
:mod:`dramatiq_unique.parking.places`; this module does the database and
Redis work around it.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Optional, Protocol

from dramatiq_unique.durable.messages import rebuild
from dramatiq_unique.locks.redlock import new_token
from dramatiq_unique.observe import events
from dramatiq_unique.parking import rows as parked
from dramatiq_unique.parking.gates import WAKE
from dramatiq_unique.parking.places import Places, max_wait, place_of
from dramatiq_unique.storage import jobs
from dramatiq_unique.storage.models import JobModel, JobStatus

if TYPE_CHECKING:
    from dramatiq_unique.broker.delivery import Delivery
    from dramatiq_unique.parking.flags import Flags
    from dramatiq_unique.parking.gates import Gate, GroupInfo
    from dramatiq_unique.parking.prestart import Started
    from dramatiq_unique.suite import Suite

logger = logging.getLogger(__name__)


class Waker(Protocol):
    """What the deck uses of the parking it serves (a :class:`~dramatiq_unique.parking.waking.Waking`):
    named here, so that the deck, which parking uses, depends on nothing above it."""

    suite: "Suite"
    delivery: "Delivery"
    started: "Started"
    wakeups: "Flags"

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
        """Reserve ``group``'s next parked rows, up to ``DEPTH`` on deck (:mod:`~dramatiq_unique.parking.places`).

        Called after a hand-over that woke a job of the group here (``since``:
        when the hand-over began), or after a job parked on the group (then
        only while a holder of the group runs here; ``place`` is that job's
        ``(created_at, process_after, id)``: if the deck is full of jobs that
        come after it in the queue, it takes the last one's place, so the deck
        keeps the queue's order).  A holder here that let its slot go after
        ``since`` (:meth:`released`) may have looked at the deck before the new
        row was on it: that row is put back and the group woken instead.
        """
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
        """Holding ``group``'s slot under ``token`` (a holder leaving, or a slot taken for the
        group's next job): start the first row on deck in the database, then pass it the slot
        and deliver it, in one Redis call; then reserve the group's next rows.  Returns the
        started row; None if there is none on deck, it is no longer ours as reserved (replaced,
        taken by another process), or the slot could not be passed (the row is then back in
        the queue, unstarted) and the caller goes on the usual way."""
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
        wake = {"g": group, "t": fresh, "w": parking.suite.worker_id, "at": int(time.monotonic() * 1000),
                events.HANDED_AT: events.now_ms()}
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
            refilled = parked.reserve_many(info, group, self.marker, booked, app=parking.suite.app)
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

    # -- what ConcurrencySlots tells us ------------------------------------------

    def holding(self, group: str, change: int) -> None:
        """Count a slot of ``group`` taken (+1) or left (-1) in this process: a job parking on
        a group reserves rows only while a holder of that group runs here."""
        self.places.holding(group, change)

    def busy(self, group: str) -> bool:
        """Whether jobs of ``group`` wait on deck here (so the group is full)."""
        return self.places.busy(group)
