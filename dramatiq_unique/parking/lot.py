"""Parking: jobs that wait for a gate (an execution lock, a slot) without holding a worker thread.

A job that cannot enter its gate is parked in its row (``pending``, ``parked_on`` its group), its
group flagged in Redis, its message acked; a holder that leaves wakes the next one.  How and why:
docs/discussions/how-it-is-built.md, "Gates: locks, slots and parking".
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
import weakref
from typing import TYPE_CHECKING, Any, Callable, Iterable, NoReturn, Optional

import peewee as pw
import redis as redis_lib
from dramatiq.middleware import SkipMessage

from dramatiq_unique.broker.delivery import Delivery
from dramatiq_unique.context import MARKER
from dramatiq_unique.durable.messages import job_options, rebuild
from dramatiq_unique.errors import DependencyUnavailable
from dramatiq_unique.guard import guarded
from dramatiq_unique.logs import PARKED, ParkedSkipFilter
from dramatiq_unique.observe import events
from dramatiq_unique.parking.deck import OnDeck
from dramatiq_unique.parking.gates import KEPT, NOT_HELD, RELEASED, WAKE, Gate, GroupInfo, gate_ttl, reservation
from dramatiq_unique.parking.groups import LOCK, SLOT, kind_of
from dramatiq_unique.redis import lua
from dramatiq_unique.storage import jobs
from dramatiq_unique.storage.models import JobModel, JobStatus, after_ms, utcnow
from dramatiq_unique.unique.enqueue import row_fields

if TYPE_CHECKING:
    import dramatiq

    from dramatiq_unique.suite import ActorConfig, Suite

logger = logging.getLogger(__name__)

#: ms between two looks of a worker's watchdog at the groups whose holder's lease ran out.
DEFAULT_WAKE_INTERVAL = 500
#: Flags looked at per watchdog pass, and groups per :func:`wake_orphans` call.
DEFAULT_PAGE = 100
#: Bound on compare-and-set rounds lost to other wakers.
MAX_ROUNDS = 20
#: ms before a group whose wake-up failed (or that no gate here knows) is looked at again.
RETRY_DELAY = 5_000
#: Seconds a row started by its claim waits for its message's pick-up (which then writes an ordinary start).
KEEP_FOR = 60.0


class Parking:
    """Parking for one suite: its gates, Redis flags, delivery and watchdog.  Get it with :func:`of`.
    Thread-safe: worker threads, the watchdog and the re-drive call it at once."""

    def __init__(self, suite: "Suite") -> None:
        self.suite = suite
        #: Woken rows their claim started, for the worker thread that picks them up.
        self.started = Started()
        self.gates: dict[str, Gate] = {}
        self.wakeups = Flags(suite.redis, suite.keys.wakeups())
        #: The Redis key of the wake-up flags.
        self.flags = self.wakeups.key
        self.delivery = Delivery(lambda: suite.broker)
        #: The next job of busy slot groups, claimed ahead (see :mod:`dramatiq_unique.parking.deck`).
        self.ondeck = OnDeck(self)
        self.wake_interval = DEFAULT_WAKE_INTERVAL
        self._watchdog: Optional[Watchdog] = None
        self._lock = threading.Lock()

    @property
    def local_handoff(self) -> bool:
        """Whether woken jobs go to this process's worker when possible (see :mod:`dramatiq_unique.broker.delivery`)."""
        return self.delivery.local

    @local_handoff.setter
    def local_handoff(self, value: bool) -> None:
        self.delivery.local = value

    def register(self, gate: Gate) -> None:
        self.gates[gate.kind] = gate

    # -- the waiter's side ---------------------------------------------------

    def park_message(
        self, gate: Gate, group: str, config: "ActorConfig", message: Any, retry_in_ms: float,
        unique_key: Optional[str] = None,
    ) -> NoReturn:
        """Park the message's job on ``group`` (a message without a row gets one first); always raises
        SkipMessage.  A job that is not waiting (a duplicate delivery, a finished or replaced job) is
        dropped, handing on a gate it was woken for rather than sit on it."""
        with guarded(f"parking job {message.message_id}"):
            job_id, revision = job_row(config, message, unique_key)
            waiting = self.park(gate, group, message, config.model, job_id, revision, retry_in_ms)
            if not waiting and jobs.get(config.model, id=job_id) is None:
                message.options.pop(MARKER, None)
                job_id, revision = job_row(config, message, unique_key)
                waiting = self.park(gate, group, message, config.model, job_id, revision, retry_in_ms)
        if waiting:
            raise SkipMessage(f"job {message.message_id} waits for {group}")
        marker = message.options.get(MARKER)
        reserved = marker.pop(WAKE, None) if isinstance(marker, dict) else None
        if isinstance(reserved, dict):
            self._hand_on(reserved)
        raise SkipMessage(f"job {message.message_id} is not waiting: a duplicate delivery")

    def park(
        self, gate: Gate, group: str, message: Any, model: type[JobModel], job_id: int, revision: int,
        retry_in_ms: float,
    ) -> bool:
        """Park ``message``'s job on ``group``; False if the job is not waiting (another delivery runs
        it, or it finished or was replaced): the caller drops the message, else acks it unrun."""
        marker = dict(message.options.get(MARKER) or {})
        reserved = marker.pop(WAKE, None)
        marker[events.PARKED_AT] = events.now_ms()  # the wait's start, read when it takes up its gate
        options = job_options(message.options, marker)
        place = jobs.park(model, job_id, revision, group, options, utcnow())
        if place is None:
            return False
        if isinstance(reserved, dict) and reserved.get("g") != group:
            self._hand_on(reserved)  # woken for another gate, which it must not sit on while parked
        # This delivery ends here: Results must not store a None for it.
        message.options["store_results"] = False
        setattr(message, PARKED, True)
        events.parked(gate.kind, message, group)
        flag_and_take = getattr(gate, "flag_and_take", None)  # both steps in one call, where the gate can
        if flag_and_take is None:
            try:
                self.wakeups.flag(group, retry_in_ms)
            except redis_lib.RedisError:
                logger.warning("Parked job %s but could not flag %s: the holder looks in the database.",
                               message.message_id, group)
        try:
            if flag_and_take is not None:
                token = flag_and_take(group, gate_ttl(gate, group), retry_in_ms)
            else:
                token = gate.take(group, gate_ttl(gate, group))
        except DependencyUnavailable:
            logger.warning("Parked job %s; could not look at %s again: the re-drive wakes it if need be.",
                           message.message_id, group)
            return True
        if token is not None:  # the holder left meanwhile: wake the head of the queue ourselves
            self.pass_on(gate, group, token, fresh=True)
        else:  # full: a holder in this process may take the next job on deck (parking/deck.py)
            self.ondeck.fill(gate, group, place=(*place, job_id))
        return True

    # -- the holder's side ---------------------------------------------------

    def leave(self, gate: Gate, group: str, token: str) -> None:
        """The holder of ``group``'s gate is done: hand the gate to the next waiter, or release it."""
        began = time.monotonic()
        if self.ondeck.hand_over(gate, group, token, since=began) is not None:  # a job reserved here first
            return
        hand_over = getattr(gate, "hand_over", None)  # re-issues the gate for the woken job in the same call
        try:
            if hand_over is not None:
                outcome, token = hand_over(group, token)
            else:
                outcome = gate.release_unless_flagged(group, token)
        except DependencyUnavailable:
            logger.warning("Could not release %s; it frees itself when its lease runs out.", group, exc_info=True)
            return
        if outcome == KEPT:
            if self.pass_on(gate, group, token, fresh=hand_over is not None) is not None:
                self.ondeck.fill(gate, group, since=began)
                return
        elif outcome == NOT_HELD or not gate.atomic_release:
            # Lost (expired) meanwhile, or released without an atomic look at
            # the flag: whoever parked must not be stranded.
            self.wake_if_flagged(gate, group)
        self.ondeck.released(gate, group)

    def _hand_on(self, reserved: dict) -> None:
        gate = self.gate_for(str(reserved.get("g", "")))
        if gate is not None:
            try:
                self.leave(gate, reserved["g"], reserved["t"])
            except Exception:
                logger.exception("Could not hand on %s; it frees itself when its lease runs out.", reserved.get("g"))

    # -- the watchdog ----------------------------------------------------------------

    def attach(self, worker: "dramatiq.Worker") -> None:
        """Called at worker boot: deliver woken jobs locally, and start the watchdog."""
        with self._lock:
            self.delivery.worker = worker
            if self._watchdog is None or not self._watchdog.alive():
                self._watchdog = Watchdog(self.tick, lambda: self.wake_interval, self.suite.close)

    def detach(self, worker: "dramatiq.Worker") -> None:
        """Called at worker shutdown: back to the broker for deliveries; stop the watchdog."""
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

    def pass_on(self, gate: Gate, group: str, token: str, fresh: bool = False) -> Optional[JobModel]:
        """Holding ``group``'s gate under ``token`` (``fresh``: in no message yet, no re-issue needed):
        wake the next parked job (returned), or release the gate (None).  On an error the gate is
        released and the group left flagged for the watchdog."""
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
                row = self._claim_next(info, group)
                if row is not None:
                    grant = token if fresh else gate.pass_to(group, token, info.ttl_ms)
                    if grant is None:  # nothing was sent: a start the claim wrote is undone too
                        if row.status == JobStatus.RUNNING.value:
                            self.started.take(row.message_id, row.revision)
                            jobs.unstart(info.model, row, group)
                        jobs.unclaim(info.model, row, group)
                        return None
                    token = grant
                    if row.status == JobStatus.QUEUED.value:  # it waits in the broker, holding the gate
                        self._note(gate, group, grant, row)
                    try:
                        self.delivery.send(rebuild(row, {WAKE: reservation(group, grant, self.suite.worker_id)}),
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
                if waiting is not None and flags:
                    # Reserved by another process for its deck (deck.py): it hands them a
                    # slot; should it die, look again when their reservation has run out.
                    gate.release(group, token)
                    self.wakeups.flag(group, waiting + 50)
                    return None
                if not flags:
                    gate.release(group, token)
                    return None
                outcome = gate.release_unless_flagged(group, token)
                if outcome == KEPT:
                    continue
                if outcome == RELEASED and not gate.atomic_release and self.wakeups.is_flagged(group):
                    again = gate.take(group, info.ttl_ms)
                    if again is not None:
                        token = again
                        continue
                return None
            raise RuntimeError(f"no settled wake-up after {MAX_ROUNDS} rounds")
        except Exception:
            logger.exception("Could not wake the next job waiting on %s; the watchdog tries again.", group)
            try:
                gate.release(group, token)
                self.wakeups.flag(group, RETRY_DELAY)
            except Exception:  # Redis is down too: the lock expires and the re-drive wakes
                pass
            return None

    def _note(self, gate: Gate, group: str, token: str, row: JobModel) -> None:
        note = getattr(gate, "note", None)  # see Gate: only the operator's views read it
        if note is None:
            return
        try:
            note(group, token, row.message_id)
        except DependencyUnavailable:
            logger.debug("Could not note job %s as the holder of %s.", row.message_id, group, exc_info=True)

    def wake_if_flagged(self, gate: Gate, group: str) -> Optional[JobModel]:
        try:
            if not self.wakeups.is_flagged(group):
                return None
        except redis_lib.RedisError:
            return None
        return self.wake(gate, group)

    def wake(self, gate: Gate, group: str) -> Optional[JobModel]:
        """Take a free slot of ``group``'s gate, if there is one, for its next waiter."""
        try:
            token = gate.take(group, gate_ttl(gate, group))
        except (DependencyUnavailable, redis_lib.RedisError):
            return None
        return None if token is None else self.pass_on(gate, group, token)

    # -- rows ------------------------------------------------------------------

    def _claim_next(self, info: GroupInfo, group: str) -> Optional[JobModel]:
        # The woken message's broker id is chosen here, so the claim records it
        # and the delivery adds no write of its own.
        now, start = utcnow(), None
        if info.start is not None and self.delivery.local and self.delivery.worker is not None:
            # Delivered to this process's worker: the claim starts the attempt too.
            start = (after_ms(info.start.lease_ms, now), f"{self.suite.worker_id}:woken", info.start.release_hold)
        row = jobs.claim_parked(
            info.model, group, info.order_by, now, str(uuid.uuid4()), start, app=self.suite.app
        )
        if row is not None and start is not None and row.status == JobStatus.RUNNING.value:
            self.started.put(row)
        return row

    # -- the watchdog's and the re-drive's look -------------------------------------

    def tick(self, limit: int = DEFAULT_PAGE) -> int:
        """One watchdog pass: wake the head of every flagged group whose holder's lease ran out."""
        self.ondeck.sweep()
        woken = 0
        for group in self.wakeups.due(limit):
            woken += self._wake_group(group) is not None
        return woken

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
        """Up to ``limit`` groups per table with parked jobs of this app, of a gate this process knows."""
        groups = []
        for model in list(self.suite.models):
            # This app's groups only: another app's, of the same name, is free in this app's Redis
            # but not this app's to wake (and the claims would find none of its rows).
            parked_here = (model.app == self.suite.app) & model.parked_on.is_null(False)
            query = (
                model.select(model.parked_on)
                .where(parked_here & (model.status == JobStatus.PENDING.value))
                .distinct()
                .limit(limit)
            )
            names = [job.parked_on for job in query if job.parked_on is not None]
            groups += [group for group in names if self.gate_for(group) is not None]
        return groups

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
        found = []
        for group in self.parked_groups(limit):
            gate = self.gate_for(group)
            if gate is not None and gate.retry_in(group) <= 0:
                found.append(group)
        return found


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


def wake_orphans(suite: "Suite", *, limit: int = DEFAULT_PAGE) -> int:
    """For the re-drive: wake parked jobs whose gate has no live holder (a lost wake-up); how many woke.
    Safe from any process at any time: a held gate is left to its holder, claims are compare-and-set."""
    return of(suite).wake_orphans(limit)


def orphaned_groups(suite: "Suite", *, limit: int = DEFAULT_PAGE) -> list[str]:
    """Groups of this app with parked jobs whose gate has no live holder (read only: what
    :func:`wake_orphans` would wake; the ``check`` command reports them)."""
    return of(suite).orphans(limit)


class Flags:
    """The wake-up flags in ``key`` on ``client``.  Every call may raise ``redis.RedisError``."""

    def __init__(self, client: redis_lib.Redis, key: str) -> None:
        self.client = client
        self.key = key
        self._flag = lua.register(client, "wakeup_flag")
        self._rescore = lua.register(client, "wakeup_rescore")
        self._due = lua.register(client, "wakeup_due")

    def flag(self, group: str, delay_ms: float) -> None:
        """Flag ``group`` as having waiters, due for a look in ``delay_ms`` (an earlier look is kept)."""
        self._flag(keys=[self.key], args=[group, int(max(delay_ms, 0))])

    def rescore(self, group: str, delay_ms: float) -> None:
        """Look at a flagged group again in ``delay_ms`` (an unflagged one stays unflagged)."""
        self._rescore(keys=[self.key], args=[group, int(max(delay_ms, 0))])

    def clear(self, group: str) -> None:
        self.client.zrem(self.key, group)

    def is_flagged(self, group: str) -> bool:
        return self.client.zscore(self.key, group) is not None

    def due(self, limit: int) -> list[str]:
        """Up to ``limit`` flagged groups whose time came."""
        return [g.decode() if isinstance(g, bytes) else g for g in self._due(keys=[self.key], args=[limit])]


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
    """Rows started by their claim in this process, until their message is picked up."""

    def __init__(self) -> None:
        self._rows: dict[str, tuple[float, "JobModel"]] = {}
        self._lock = threading.Lock()

    def put(self, row: "JobModel") -> None:
        now = time.monotonic()
        with self._lock:
            if len(self._rows) > 1000:  # picked up elsewhere or never: do not keep them forever
                self._rows = {k: v for k, v in self._rows.items() if now - v[0] < KEEP_FOR}
            self._rows[row.message_id] = (now, row)

    def take(self, message_id: str, revision: int) -> "Optional[JobModel]":
        """The row started for this message's delivery, once; None if there is none (or it is stale)."""
        with self._lock:
            entry = self._rows.pop(message_id, None)
        if entry is None or time.monotonic() - entry[0] > KEEP_FOR or entry[1].revision != revision:
            return None
        return entry[1]


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


def job_row(config: "ActorConfig", message: Any, unique_key: Optional[str] = None) -> tuple[int, int]:
    """The message's job row id and revision; a message sent without the suite gets a row."""
    marker = message.options.get(MARKER) or {}
    if "id" in marker:
        return int(marker["id"]), int(marker.get("rev", 0))
    fields = row_fields(config, message, None)
    fields["unique_key"] = unique_key
    # Revision 0 even of a row an earlier delivery made: the message is that row's first
    # revision (JobTracking._adopt, after a job_row, finds the marker and adopts nothing).
    job_id, _, _ = jobs.adopt(config.model, fields)
    message.options[MARKER] = {**marker, "id": job_id, "rev": 0}
    return int(job_id), 0


def parked_counts(
    models: Iterable[type[JobModel]], app: str, actors: Iterable["ActorConfig"] = ()
) -> dict[tuple[str, str], int]:
    """The jobs of ``app`` parked now, by (actor, gate kind): for the parked-jobs gauge.
    One query per table, on the (app, parked_on) index.  Every actor of ``actors`` that may
    park reads 0 when none is: the gauge keeps each process's last count, and a group that
    emptied must not keep the count another process saw."""
    counts: dict[tuple[str, str], int] = {}
    for config in actors:
        if config.unique:
            counts[(config.actor_name, LOCK)] = 0
        if config.has_slots:
            counts[(config.actor_name, SLOT)] = 0
    for model in models:
        kind = pw.Case(None, [(model.parked_on.startswith(f"{SLOT}:"), SLOT)], LOCK)
        query = model.select(model.actor_name, kind, pw.fn.COUNT(model.id)).where(
            (model.app == app) & model.parked_on.is_null(False) & (model.status == JobStatus.PENDING.value)
        ).group_by(model.actor_name, pw.SQL("2"))  # by position: psycopg 3 binds the CASE's values anew there
        row: Any
        for row in query.tuples():  # tuples, which peewee's hints call models
            actor, gate, count = row
            counts[(actor, gate)] = counts.get((actor, gate), 0) + int(count)
    return counts
