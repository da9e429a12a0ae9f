"""Parking: jobs that wait for a gate (an execution lock, a slot) without holding a worker thread.

A job that cannot enter its gate is parked in its row (``pending``, ``parked_on`` its group), its group flagged in
Redis, its message acked; a holder that leaves wakes the next one, first from the rows this process reserved on deck.
How and why: docs/discussions/how-it-is-built.md, "Gates: locks, slots and parking".
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
import uuid
import weakref
from typing import TYPE_CHECKING, Any, Callable, Iterable, NoReturn, Optional

import peewee as pw
import redis as redis_lib
from dramatiq.middleware import SkipMessage

from dramatiq_unique.broker.publish import Delivery
from dramatiq_unique.context import MARKER
from dramatiq_unique.durable.messages import job_options, rebuild
from dramatiq_unique.errors import DependencyUnavailable
from dramatiq_unique.guard import guarded
from dramatiq_unique.locks.redlock import new_token
from dramatiq_unique.logs import PARKED, ParkedSkipFilter
from dramatiq_unique.observe import events
from dramatiq_unique.parking.groups import LOCK, SLOT, WAKE, Gate, GroupInfo, gate_ttl, kind_of, reservation
from dramatiq_unique.redis import lua
from dramatiq_unique.redis.lua import KEPT, NOT_HELD, RELEASED
from dramatiq_unique.storage import jobs
from dramatiq_unique.storage.models import JobModel, JobStatus, after_ms, utcnow
from dramatiq_unique.unique.enqueue import row_fields

if TYPE_CHECKING:
    import dramatiq

    from dramatiq_unique.suite import ActorConfig, Suite

logger = logging.getLogger(__name__)

#: ms between two looks of a worker's watchdog at the groups whose holder's lease ran out.
DEFAULT_WAKE_INTERVAL = 500
#: Flags looked at per watchdog pass, and groups per :meth:`Parking.wake_orphans` call.
DEFAULT_PAGE = 100
#: Bound on compare-and-set rounds lost to other wakers.
MAX_ROUNDS = 20
#: ms before a group whose wake-up failed (or that no gate here knows) is looked at again.
RETRY_DELAY = 5_000
#: Rows on deck per group and process: two, so that two holders of a group here that
#: finish together both hand over in one step.
DEPTH = 2
#: ms a reserved row may wait on deck before the watchdog puts it back in the queue (at most half the group's slot
#: lease, the length of a reservation in the database: so a killed process's rows are free about when its slots are).
MAX_WAIT_MS = 2_000
#: ms a leaving holder waits for this process's reservations of its group under way (one statement
#: each): its claim would skip the rows they lock and take a later job first.
SETTLE_WAIT_MS = 200
#: Seconds a row started by its claim waits for its message's pick-up (which then writes an ordinary start).
KEEP_FOR = 60.0


class Parking:
    """Parking for one suite (get it with :func:`of`): worker threads, the watchdog and the re-drive call it at once."""

    def __init__(self, suite: "Suite") -> None:
        self.suite = suite
        #: Woken rows their claim started, for the worker thread that picks them up.
        self.started = Started()
        self.gates: dict[str, Gate] = {}
        self.wakeups = Flags(suite.redis, suite.keys.wakeups())
        self.delivery = Delivery(lambda: suite.broker)
        #: The next jobs of busy slot groups, reserved ahead (:class:`OnDeck`).
        self.ondeck = OnDeck(self)
        self.wake_interval = DEFAULT_WAKE_INTERVAL
        self._watchdog: Optional[Watchdog] = None
        self._lock = threading.Lock()

    def register(self, gate: Gate) -> None:
        self.gates[gate.kind] = gate

    # -- the waiter's side ---------------------------------------------------

    def park_message(self, gate: Gate, group: str, config: "ActorConfig", message: Any, retry_in_ms: float,
                     unique_key: Optional[str] = None) -> NoReturn:
        """Park the message's job (a message without a row gets one first): SkipMessage.  A job that is
        not waiting (a duplicate delivery, a finished or replaced job) is dropped, handing on a gate it
        was woken for rather than sit on it."""
        with guarded(f"parking job {message.message_id}"):
            job_id, revision = job_row(config, message, unique_key)
            waiting = self.park(gate, group, message, config.model, job_id, revision, retry_in_ms)
            if not waiting and config.model.get_or_none(id=job_id) is None:
                message.options.pop(MARKER, None)
                job_id, revision = job_row(config, message, unique_key)
                waiting = self.park(gate, group, message, config.model, job_id, revision, retry_in_ms)
        if waiting:
            raise SkipMessage(f"job {message.message_id} waits for {group}")
        marker = message.options.get(MARKER)
        reserved = marker.pop(WAKE, None) if isinstance(marker, dict) else None
        if isinstance(reserved, dict):
            self.hand_on(str(reserved.get("g")), str(reserved.get("t")))
        raise SkipMessage(f"job {message.message_id} is not waiting: a duplicate delivery")

    def park(self, gate: Gate, group: str, message: Any, model: type[JobModel], job_id: int, revision: int,
             retry_in_ms: float) -> bool:
        """False if the job is not waiting (another delivery runs it, it finished or was replaced)."""
        marker = dict(message.options.get(MARKER) or {})
        reserved = marker.pop(WAKE, None)
        marker[events.PARKED_AT] = events.now_ms()  # the wait's start, read when it takes up its gate
        options = job_options(message.options, marker)
        place = jobs.park(model, job_id, revision, group, options, utcnow())
        if place is None:
            return False
        if isinstance(reserved, dict) and reserved.get("g") != group:
            self.hand_on(str(reserved.get("g")), str(reserved.get("t")))  # woken for another gate: not to sit on
        # This delivery ends here: Results must not store a None for it.
        message.options["store_results"] = False
        setattr(message, PARKED, True)
        events.parked(gate.kind, message, group)
        asked = time.monotonic()
        try:
            token = gate.flag_and_take(group, gate_ttl(gate, group), retry_in_ms)
        except DependencyUnavailable:
            logger.warning("Parked job %s; could not look at %s again: the re-drive wakes it if need be.",
                           message.message_id, group)
            return True
        if token is not None:  # the holder left meanwhile: wake the head of the queue ourselves
            self.pass_on(gate, group, token, fresh=True, granted=asked)
        else:  # full: a holder in this process may take the next job on deck (OnDeck)
            self.ondeck.fill(gate, group, place=(*place, job_id))
        return True

    # -- the holder's side ---------------------------------------------------

    def leave(self, gate: Gate, group: str, token: str) -> None:
        """The holder of ``group``'s gate is done: hand the gate to the next waiter, or release it."""
        began = time.monotonic()
        if self.ondeck.hand_over(gate, group, token, since=began) is not None:  # a job reserved here first
            return
        try:
            outcome, handed = gate.hand_over(group, token)
        except DependencyUnavailable:
            logger.warning("Could not release %s; it frees itself when its lease runs out.", group, exc_info=True)
            return
        if outcome == KEPT:
            if self.pass_on(gate, group, handed, fresh=handed != token, granted=began) is not None:
                self.ondeck.fill(gate, group, since=began)
                return
        elif outcome == NOT_HELD or not gate.atomic_release:
            # Lost (expired) meanwhile, or released without an atomic look at
            # the flag: whoever parked must not be stranded.
            self.wake_if_flagged(gate, group)
        self.ondeck.released(gate, group)

    def hand_on(self, group: str, token: str) -> None:
        """:meth:`leave`, for a gate of a kind registered here; what fails is logged."""
        gate = self.gate_for(group)
        if gate is not None:
            try:
                self.leave(gate, group, token)
            except Exception:
                logger.exception("Could not hand on %s; it frees itself when its lease runs out.", group)

    # -- the watchdog ----------------------------------------------------------------

    def attach(self, worker: "dramatiq.Worker") -> None:
        """At worker boot: deliver woken jobs locally, and start the watchdog."""
        with self._lock:
            self.delivery.worker = worker
            if self._watchdog is None or not self._watchdog.alive():
                self._watchdog = Watchdog(self.tick, lambda: self.wake_interval, self.suite.close)

    def detach(self, worker: "dramatiq.Worker") -> None:
        """At worker shutdown: back to the broker for deliveries; stop the watchdog."""
        with self._lock:
            if self.delivery.worker is worker:
                self.delivery.worker = None
            watchdog, self._watchdog = self._watchdog, None
        if watchdog is not None:
            watchdog.stop()
        self.ondeck.sweep(0)  # no local worker to run them any more

    # -- waking ----------------------------------------------------------------

    def gate_for(self, group: str) -> Optional[Gate]:
        """The gate ``group``'s jobs park on; None if no gate of its kind is registered here."""
        return self.gates.get(kind_of(group))

    def pass_on(self, gate: Gate, group: str, token: str, fresh: bool = False,
                granted: Optional[float] = None) -> Optional[JobModel]:
        """Holding ``group``'s gate under ``token`` (``fresh``: in no message yet, no re-issue needed;
        ``granted``: when its lease was asked for, monotonic): wake the next parked job (returned), or
        release the gate.  On an error the gate is released and the group left flagged for the watchdog."""
        woken = self.ondeck.hand_over(gate, group, token)  # a job reserved here comes first
        if woken is not None:
            return woken
        info = gate.describe(group)
        try:
            if info is None:  # no actor of this group here: leave it to a process that has one
                gate.release(group, token)
                self.wakeups.rescore(group, RETRY_DELAY)
                return None
            for _ in range(MAX_ROUNDS):
                # The woken job counts its reservation from the first lease it runs under: a fresh
                # token's grant, or else the claim's start (a pass_to after the claim comes later).
                asked = granted if fresh and granted is not None else time.monotonic()
                row = self._claim_next(info, group, asked)
                if row is not None:
                    grant = token if fresh else gate.pass_to(group, token, info.ttl_ms)
                    if grant is None:  # nothing was sent: a start the claim wrote is undone too
                        if row.status == JobStatus.RUNNING.value:
                            self.started.take(row.message_id, row.revision)
                            jobs.unstart(info.model, row, group)
                        jobs.unclaim(info.model, row, group)
                        return None
                    token = grant
                    # It waits in the broker, holding the gate: noted where the gate keeps notes (SlotGate).
                    if row.status == JobStatus.QUEUED.value and hasattr(gate, "note"):
                        try:  # only the operator's views read it
                            gate.note(group, grant, row.message_id)
                        except DependencyUnavailable:
                            logger.debug("Could not note job %s as the holder of %s.", row.message_id, group,
                                         exc_info=True)
                    try:
                        self.delivery.send(rebuild(row, {WAKE: reservation(group, grant, self.suite.worker_id, asked)}),
                                           row.broker_ref)
                        logger.debug("Woke job %s waiting on %s.", row.message_id, group)
                    except BaseException:
                        jobs.unclaim(info.model, row, group)
                        raise
                    return row
                # Nobody left: clear the flag, then look again (a waiter flags after it parks).
                try:
                    self.wakeups.clear(group)
                    flags = True
                except redis_lib.RedisError:  # the first master is down: go by the database alone
                    flags = False
                waiting = waiting_in(info, group, app=self.suite.app)
                if waiting == 0:
                    if flags:
                        self.wakeups.flag(group, 0)
                    continue
                if waiting is not None or not flags:
                    gate.release(group, token)
                    if waiting is not None and flags:
                        # Reserved by another process for its deck: it hands them a
                        # slot; should it die, look again when their reservation has run out.
                        self.wakeups.flag(group, waiting + 50)
                    # No flag to go by: a job that parked while this one looked tried the gate
                    # before the release and found it held. Look again now it is free.
                    again = waiting is None and waiting_in(info, group, app=self.suite.app) == 0
                else:
                    asking = time.monotonic()
                    outcome, handed = gate.hand_over(group, token)
                    if outcome == KEPT:  # held for the next waiter, maybe re-issued: then no pass_to
                        if handed != token:
                            granted = asking
                        fresh, token = fresh or handed != token, handed
                        continue
                    again = outcome == RELEASED and not gate.atomic_release and self.wakeups.is_flagged(group)
                asking = time.monotonic()
                retaken = gate.take(group, info.ttl_ms) if again else None
                if retaken is None:
                    return None
                token, granted = retaken, asking
            raise RuntimeError(f"no settled wake-up after {MAX_ROUNDS} rounds")
        except Exception:
            logger.exception("Could not wake the next job waiting on %s; the watchdog tries again.", group)
            try:
                gate.release(group, token)
                self.wakeups.flag(group, RETRY_DELAY)
            except Exception:  # Redis is down too: the lock expires and the re-drive wakes
                pass
            return None

    def wake_if_flagged(self, gate: Gate, group: str) -> Optional[JobModel]:
        try:
            flagged = self.wakeups.is_flagged(group)
        except redis_lib.RedisError:
            return None
        return self.wake(gate, group) if flagged else None

    def wake(self, gate: Gate, group: str) -> Optional[JobModel]:
        """Take a free place in ``group``'s gate, if there is one, for its next waiter."""
        try:
            token = gate.take(group, gate_ttl(gate, group))
        except (DependencyUnavailable, redis_lib.RedisError):
            return None
        return None if token is None else self.pass_on(gate, group, token)

    # -- rows ------------------------------------------------------------------

    def _claim_next(self, info: GroupInfo, group: str, asked: float) -> Optional[JobModel]:
        # The woken message's broker id is chosen here, so the claim records it
        # and the delivery adds no write of its own.
        now, start = utcnow(), None
        if info.start is not None and self.delivery.local and self.delivery.worker is not None:
            # Delivered to this process's worker: the claim starts the attempt too.
            config = info.start
            start = (after_ms(config.unique_ttl, now), f"{self.suite.worker_id}:woken", config.released_at_start)
        row = jobs.claim_parked(info.model, group, info.order_by, now, str(uuid.uuid4()), start, app=self.suite.app)
        if row is not None and start is not None and row.status == JobStatus.RUNNING.value:
            self.started.put(row, asked)
        return row

    # -- the watchdog's and the re-drive's look -------------------------------------

    def tick(self, limit: int = DEFAULT_PAGE) -> int:
        """One watchdog pass: wake the head of every flagged group whose holder's lease ran out."""
        self.ondeck.sweep()
        return sum(self._wake_group(group) is not None for group in self.wakeups.due(limit))

    def _wake_group(self, group: str) -> Optional[JobModel]:
        gate = self.gate_for(group)
        info = gate.describe(group) if gate is not None else None
        if gate is None or info is None:
            self.wakeups.rescore(group, RETRY_DELAY)
            return None
        token = gate.take(group, info.ttl_ms)
        if token is None:  # still held: look again when that lease runs out
            self.wakeups.rescore(group, max(gate.retry_in(group), 50) + 10)
            return None
        return self.pass_on(gate, group, token)

    def parked_groups(self, limit: int = DEFAULT_PAGE) -> list[str]:
        """Up to ``limit`` groups per table with parked jobs of this app, of a gate this process knows.
        This app's only: another app's group of the same name is free in this app's Redis but not this
        app's to wake (and the claims would find none of its rows)."""
        found = (parked_on(model, self.suite.app, limit=limit) for model in list(self.suite.models))
        return [group for groups in found for group in groups if self.gate_for(group) is not None]

    def wake_orphans(self, limit: int = DEFAULT_PAGE) -> int:
        """Wake the first parked job of every group of this app whose gate is free; returns how many woke."""
        woken = 0
        for group in self.parked_groups(limit):
            self.wakeups.flag(group, 0)  # Redis may have lost it
            woken += self._wake_group(group) is not None
        return woken

    def orphans(self, limit: int = DEFAULT_PAGE) -> list[str]:
        """Groups with parked jobs whose gate has no live holder: what :meth:`wake_orphans` would wake
        (read only; for the ``check`` command).  A halted slot group is not one: its jobs wait by design."""
        return [group for group in self.parked_groups(limit) if self.gates[kind_of(group)].retry_in(group) <= 0]


class OnDeck:
    """The rows on deck of one :class:`Parking`, by group: the next jobs of a busy slot group, reserved
    ahead by the process whose holder runs.  When a holder here leaves, the first row on deck is started
    by a compare-and-set on what its reservation read, then handed the slot and delivered in one Redis
    call: one commit and one Redis call on a hand-over's critical path."""

    def __init__(self, parking: "Parking") -> None:
        self.parking = parking
        self.enabled = True
        self.places = Places()
        #: The ``worker`` value of the rows this process reserved.
        self.marker = f"{parking.suite.worker_id}:deck"

    def fill(self, gate: "Gate", group: str, *, since: Optional[float] = None, place: Optional[tuple] = None) -> None:
        """Reserve ``group``'s next parked rows, up to ``DEPTH`` on deck: after a hand-over that woke a
        job of the group here (``since``: when it began), or after a job parked on it while a holder runs
        here (``place``: its ``(created_at, process_after, id)``, which may take the last row's place).
        A row that raced a holder here letting its slot go after ``since`` is put back, the group woken."""
        delivery = self.parking.delivery
        if not (self.enabled and hasattr(gate, "pass_and_deliver") and delivery.local and delivery.worker is not None):
            return  # a lock has no deck; a woken job needs a local worker
        began = time.monotonic() if since is None else since
        info = gate.describe(group)
        if info is None or info.start is None or info.start.released_at_start:
            return  # its start would take more than this module writes
        late = None if place is None else place_of(info.order_by, *place)
        while self.places.book(group, with_holder=since is None, late=late):
            late = None
            rows: list[JobModel] = []
            try:
                rows = self._reserve(info, group, 1)
            finally:
                kept = self._settle(gate, group, info, rows, began, booked=1)
            if not kept:
                return

    def _reserve(self, info: GroupInfo, group: str, count: int) -> list[JobModel]:
        """Up to ``count`` rows reserved for the group's slot lease, by the database's clock."""
        rows: list[JobModel] = []
        while len(rows) < count:
            row = jobs.reserve(info.model, group, info.order_by, self.marker, info.ttl_ms, app=self.parking.suite.app)
            if row is None:
                break
            rows.append(row)
        return rows

    def _settle(self, gate: "Gate", group: str, info: "GroupInfo", rows: list[JobModel], began: float,
                booked: int) -> bool:
        """Put freshly reserved rows on deck (``booked`` places were counted for them), those that cannot
        stay back; True if all were kept."""
        back, raced = self.places.settle(group, info, rows, began, booked)
        for row in back:
            self.put_back(info, row, group)
        if raced and back:
            self.parking.wake_if_flagged(gate, group)  # a slot may be free for them
        return bool(rows) and not back

    def hand_over(self, gate: "Gate", group: str, token: str, since: Optional[float] = None) -> Optional[JobModel]:
        """Holding ``group``'s slot under ``token``: start the first row on deck, then pass it the slot and
        deliver it in one Redis call, then reserve the next rows; the started row.  None (the caller goes
        on the usual way) if none is on deck, it is no longer ours as reserved, or the pass failed."""
        began = time.monotonic() if since is None else since
        # With the places left on deck, booked now (see fill()).  A reservation under way locks the row it
        # takes, which a claim would skip: it is waited for, so the queue's order holds.
        first = self.places.take_first(group, SETTLE_WAIT_MS)
        if first is None:
            return None
        deck, booked = first
        parking, row, info = self.parking, deck.row, deck.info
        assert info.start is not None
        started = None
        asked = time.monotonic()  # the start's lease and the slot passed on run from here
        if not deck.stale(asked):  # else its reservation may be running out
            try:  # verified and started before anything is delivered: a stale reservation starts nothing
                started = jobs.start_reserved(
                    info.model, row, self.marker, f"{parking.suite.worker_id}:woken", info.start.unique_ttl
                )
            except Exception:
                logger.exception("Could not start job %s, on deck.", row.message_id)
        passed, plan = False, None
        if started is not None:
            fresh = new_token()
            try:
                # Built from the row as the start returned it: the database's arguments, not the deck's copy.
                wake = reservation(group, fresh, parking.suite.worker_id, asked)
                plan = parking.delivery.plan(rebuild(started, {WAKE: wake}), started.broker_ref)
                if plan is not None:
                    parking.started.put(started, asked)
                    passed = gate.pass_and_deliver(  # type: ignore[attr-defined]
                        group, token, fresh, info.ttl_ms, plan.keys, plan.args
                    )
            except Exception:
                logger.exception("Could not hand %s to job %s, on deck.", group, row.message_id)
        if not passed or plan is None:
            logger.debug("Job %s, on deck, was not handed %s (changed, taken, waited too long or the pass failed).",
                         row.message_id, group)
            if started is not None:
                parking.started.take(started.message_id, started.revision)
            self._settle(gate, group, info, [], began, booked)
            self.put_back(info, row, group, started)  # cleared if still ours, the group flagged
            return None
        plan.complete()
        time.sleep(0)  # yield the GIL: the woken job's thread goes first, the next reservations after
        refilled: list[JobModel] = []
        try:
            refilled = self._reserve(info, group, booked)
        except Exception:
            logger.exception("Could not reserve the next jobs of %s.", group)
        finally:
            self._settle(gate, group, info, refilled, began, booked)
        logger.debug("Handed %s to job %s, on deck.", group, row.message_id)
        return started

    def released(self, gate: "Gate", group: str) -> None:
        """A holder of ``group`` here left without handing its slot on (nobody was waiting, or it had
        lost the slot): a row reserved meanwhile would wait for nobody, so it is woken."""
        if not self.enabled or not hasattr(gate, "pass_and_deliver"):
            return  # a gate without a deck (an execution lock): nothing to note on every leave
        if self.places.released(group):
            self.parking.wake(gate, group)

    def put_back(self, info: "GroupInfo", row: JobModel, group: str, started: Optional[JobModel] = None) -> None:
        """Clear a reservation (undoing ``started``, a start not delivered): the row is an ordinary
        parked job again, and its group flagged."""
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

    def sweep(self, max_wait_ms: Optional[float] = None) -> None:
        """Put back the rows that waited on deck too long (all of them with ``max_wait_ms=0``)."""
        for group, deck in self.places.stale(max_wait_ms):
            self.put_back(deck.info, deck.row, group)


@dataclasses.dataclass
class Deck:
    """A row on deck: reserved for this process, waiting for a holder of its group here."""

    row: JobModel
    info: GroupInfo
    since: float  # monotonic seconds

    @property
    def key(self) -> tuple:
        return place_of(self.info.order_by, self.row.created_at, self.row.process_after, self.row.id)

    def stale(self, now: float, max_wait_ms: Optional[float] = None) -> bool:
        """Whether it waited ``max_wait_ms`` by ``now``: by default, at most half the group's slot lease."""
        limit = min(MAX_WAIT_MS, self.info.ttl_ms / 2) if max_wait_ms is None else max_wait_ms
        return (now - self.since) * 1000 >= limit


def place_of(order_by: str, created_at: Any, process_after: Any, job_id: int) -> tuple:
    """A row's place in its group's queue (as the claim orders them)."""
    first = process_after if order_by == "process_after" and process_after is not None else created_at
    return (first, job_id)


class Places:
    """The places on deck of one process, by group.  Thread-safe."""

    def __init__(self) -> None:
        self._decks: dict[str, list[Deck]] = {}
        self._holders: dict[str, int] = {}
        self._coming: dict[str, int] = {}  # group: reservations under way
        self._missed: dict[str, float] = {}  # group: when a holder here last let its slot go
        self._missed_cap = 1000
        self._lock = threading.Lock()
        self._settled = threading.Condition(self._lock)

    def book(self, group: str, *, with_holder: bool, late: Optional[tuple] = None) -> bool:
        """Count a place on deck for one reservation before it is made; False if none is left
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

    def settle(self, group: str, info: GroupInfo, rows: list[JobModel], began: float,
               booked: int) -> tuple[list[JobModel], bool]:
        """Put freshly reserved rows on deck: the rows that cannot stay, and whether a holder here let its
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
                # A message that brought unique options of its own starts the usual way, not from the deck.
                if raced or any(str(k).startswith("unique_") for k in (row.options or {})):
                    back.append(row)
                    continue
                decks = self._decks.setdefault(group, [])
                decks.append(Deck(row, info, time.monotonic()))
                decks.sort(key=lambda d: d.key)
                if len(decks) > DEPTH:
                    back.append(decks.pop().row)
            self._settled.notify_all()
        return back, raced

    def take_first(self, group: str, wait_ms: float = 0) -> Optional[tuple[Deck, int]]:
        """Take the first row on deck off it, and book the places then free for its refill:
        ``(deck, booked)``; None if there is none.  With the deck empty and reservations under way,
        wait up to ``wait_ms`` for them to settle first."""
        with self._lock:
            deadline = time.monotonic() + wait_ms / 1000
            while not self._decks.get(group) and self._coming.get(group, 0):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._settled.wait(remaining)
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
        """Take off the deck the rows that waited too long (all with ``max_wait_ms=0``)."""
        now = time.monotonic()
        stale: list[tuple[str, Deck]] = []
        with self._lock:
            for group, decks in list(self._decks.items()):
                stale += [(group, d) for d in decks if d.stale(now, max_wait_ms)]
                keep = [d for d in decks if not d.stale(now, max_wait_ms)]
                if keep:
                    self._decks[group] = keep
                else:
                    del self._decks[group]
        return stale

    def holding(self, group: str, change: int) -> None:
        """Count a slot taken (+1) or left (-1) in this process."""
        with self._lock:
            count = self._holders.get(group, 0) + change
            if count > 0:
                self._holders[group] = count
            else:
                self._holders.pop(group, None)

    def busy(self, group: str) -> bool:
        return bool(self._decks.get(group))  # a read of one dict entry: no lock needed


_parkings: "weakref.WeakKeyDictionary[Suite, Parking]" = weakref.WeakKeyDictionary()
_parkings_lock = threading.Lock()


def of(suite: "Suite") -> Parking:
    """The suite's :class:`Parking` (one per suite)."""
    with _parkings_lock:
        parking = _parkings.get(suite)
        if parking is None:
            parking = _parkings[suite] = Parking(suite)
            ParkedSkipFilter.install()
        return parking


class Flags:
    """The wake-up flags in ``key`` on ``client``.  Every call may raise ``redis.RedisError``."""

    def __init__(self, client: redis_lib.Redis, key: str) -> None:
        self.client = client
        self.key = key
        self.scripts = {name: lua.register(client, f"wakeup_{name}") for name in ("flag", "rescore", "due")}

    def flag(self, group: str, delay_ms: float) -> None:
        """Flag ``group`` as having waiters, due for a look in ``delay_ms`` (an earlier look is kept)."""
        self.scripts["flag"](keys=[self.key], args=[group, int(max(delay_ms, 0))])

    def rescore(self, group: str, delay_ms: float) -> None:
        """Look at a flagged group again in ``delay_ms`` (an unflagged one stays unflagged)."""
        self.scripts["rescore"](keys=[self.key], args=[group, int(max(delay_ms, 0))])

    def clear(self, group: str) -> None:
        self.client.zrem(self.key, group)

    def is_flagged(self, group: str) -> bool:
        return self.client.zscore(self.key, group) is not None

    def due(self, limit: int) -> list[str]:
        """Up to ``limit`` flagged groups whose time came."""
        return [g.decode() if isinstance(g, bytes) else g for g in self.scripts["due"](keys=[self.key], args=[limit])]


class Watchdog:
    """A daemon thread calling ``tick`` every ``interval_ms()``, backing off while it fails; ``release``
    frees its database connection at exit and after a failed pass (one that died with its server)."""

    def __init__(self, tick: Callable[[], object], interval_ms: Callable[[], float],
                 release: Callable[[], None]) -> None:
        self._tick, self._interval_ms, self._on_exit = tick, interval_ms, release
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="dramatiq_unique-wakeups", daemon=True)
        self._thread.start()

    def alive(self) -> bool:
        return self._thread.is_alive() and not self._stop.is_set()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def _run(self) -> None:
        failures = 0
        try:
            while not self._stop.wait(self._interval_ms() / 1000 * min(2**failures, 20)):
                try:
                    self._tick()
                    failures = 0
                except Exception:
                    failures += 1
                    logger.warning("Wake-up watchdog pass failed; trying again.", exc_info=failures == 1)
                    try:
                        self._on_exit()
                    except Exception:
                        logger.debug("Could not release the watchdog's connection.", exc_info=True)
        finally:
            self._on_exit()


class Started:
    """Rows started by their claim in this process, until their message is picked up, each with
    when its start was asked for (monotonic): its lease runs from then."""

    def __init__(self) -> None:
        self._rows: dict[str, tuple[float, "JobModel"]] = {}
        self._lock = threading.Lock()

    def put(self, row: "JobModel", asked: float) -> None:
        now = time.monotonic()
        with self._lock:
            if len(self._rows) > 1000:  # picked up elsewhere or never: do not keep them forever
                self._rows = {k: v for k, v in self._rows.items() if now - v[0] < KEEP_FOR}
            self._rows[row.message_id] = (asked, row)

    def take(self, message_id: str, revision: int) -> "Optional[tuple[JobModel, float]]":
        """The row started for this message's delivery and when its start was asked for, once; None
        if there is none (or it is stale)."""
        with self._lock:
            entry = self._rows.pop(message_id, None)
        if entry is None or time.monotonic() - entry[0] > KEEP_FOR or entry[1].revision != revision:
            return None
        return entry[1], entry[0]


def waiting_in(info: "GroupInfo", group: str, *, app: str) -> Optional[float]:
    """ms until a row of ``app`` parked on ``group`` may be claimed: 0 if one may be now, else
    until the first reservation on deck runs out; None if none waits.  One query, one clock: asked
    as two, a reservation that ran out between them looked neither due nor reserved."""
    model, now = info.model, utcnow()
    clock = pw.SQL(jobs.db_now(model._meta.database))  # reservations run by the database's clock
    free = model.lease_until.is_null() | (model.lease_until <= clock)
    row: Any = model.select(  # a tuple (.tuples()), which peewee's hints call a model
        pw.fn.COUNT(pw.Case(None, [(free, 1)], None)), pw.fn.MIN(pw.Case(None, [(free, None)], model.lease_until)),
        clock,
    ).where(
        (model.app == app) & (model.parked_on == group) & (model.status == JobStatus.PENDING.value)
        & (model.process_after.is_null() | (model.process_after <= now))
    ).tuples().get()
    free_rows, until, db_time = row
    if free_rows:
        return 0.0
    if until is None:
        return None
    # SQLite hands back text for an aggregate and for its clock.
    until, db_time = (model.lease_until.python_value(v) if isinstance(v, str) else v for v in (until, db_time))
    return max((until - db_time).total_seconds() * 1000, 0)


def parked(model: type[JobModel], app: str, prefix: str = "") -> Any:
    """Where a row is a job of ``app`` parked (on a group starting with ``prefix``)."""
    where = (model.app == app) & model.parked_on.is_null(False) & (model.status == JobStatus.PENDING.value)
    if prefix:
        where &= pw.fn.SUBSTR(model.parked_on, 1, len(prefix)) == prefix
    return where


def parked_on(model: type[JobModel], app: str, prefix: str = "", limit: Optional[int] = None) -> list[str]:
    """The groups (starting with ``prefix``) that jobs of ``app`` are parked on in ``model``'s table."""
    query = model.select(model.parked_on).where(parked(model, app, prefix)).distinct().limit(limit)
    return [str(job.parked_on) for job in query]


def job_row(config: "ActorConfig", message: Any, unique_key: Optional[str] = None) -> tuple[int, int]:
    """The message's job row id and revision; a message sent without the suite gets a row."""
    marker = message.options.get(MARKER) or {}
    if "id" in marker:
        return int(marker["id"]), int(marker.get("rev", 0))
    fields = row_fields(config, message, None)
    fields["unique_key"] = unique_key
    # Revision 0 even of a row an earlier delivery made: the message is that row's first
    # revision (JobTracking._start, after a job_row, finds the marker and adopts nothing).
    job_id, _, _ = jobs.adopt(config.model, fields)
    message.options[MARKER] = {**marker, "id": job_id, "rev": 0}
    return int(job_id), 0


def parked_counts(models: Iterable[type[JobModel]], app: str,
                  actors: Iterable["ActorConfig"] = ()) -> dict[tuple[str, str], int]:
    """The jobs of ``app`` parked now, by (actor, gate kind): for the parked-jobs gauge. One query per table, on the
    (app, parked_on) index.  Every actor of ``actors`` that may park reads 0 when none is: the gauge keeps each
    process's last count, and a group that emptied must not keep the count another process saw."""
    counts: dict[tuple[str, str], int] = {}
    for config in actors:
        if config.unique:
            counts[(config.actor_name, LOCK)] = 0
        if config.has_slots:
            counts[(config.actor_name, SLOT)] = 0
    for model in models:
        kind = pw.Case(None, [(model.parked_on.startswith(f"{SLOT}:"), SLOT)], LOCK)
        query = model.select(model.actor_name, kind, pw.fn.COUNT(model.id)).where(parked(model, app)).group_by(
            model.actor_name, pw.SQL("2")  # by position: psycopg 3 binds the CASE's values anew there
        )
        row: Any
        for row in query.tuples():  # tuples, which peewee's hints call models
            actor, gate, count = row
            counts[(actor, gate)] = counts.get((actor, gate), 0) + int(count)
    return counts
