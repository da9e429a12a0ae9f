"""Parking: jobs that wait for a gate without holding a worker thread.

A *gate* is something a job must hold to run: an execution lock
(:class:`~dramatiq_unique.middleware.ExecutionLocks`), a concurrency
slot.  Jobs queue for a gate by *group*, a name such as
``lock:<unique key>`` (the part before the first colon names the
gate's kind: see :mod:`dramatiq_unique.parking.groups`).  A message whose job cannot enter its gate is *parked*:

* its row goes to ``status = "pending"`` with ``parked_on = group``, and
  keeps the message's current options (retry count included);
* the group is flagged in a Redis sorted set (``RedisKeys.wakeups``),
  scored with the time the holder's lease runs out;
* the message is acked without running (``SkipMessage``): it holds no
  worker thread, burns no retry and nothing polls for it.

A row is parked exactly when ``status = "pending"`` and ``parked_on`` is
set.  When the holder leaves the gate it hands it over (:meth:`Parking.leave`):
if the group is flagged, the next due parked row of the group and of
this app (``app = key_prefix``: apps that share the table share group
names; by ``unique_order_by``: ``created_at`` or ``process_after``, then ``id``) is
claimed with a compare-and-set (``parked_on = group`` and ``pending`` to
``queued``, so exactly one waiter wakes per release and two wakers
never claim the same row), the gate is re-issued to it under a new token
(so no fresh message can barge in, and a stale copy of an older message
can never pass for the holder), and its message is rebuilt from the row
(same ``message_id``, arguments, options and marker, plus the
reservation) and delivered.  With no one waiting the gate is simply
released: on one Redis master the no-waiter release is one atomic
script call.

Race freedom.  The waiter writes the database (parks) and then Redis
(flag), then tries the gate once more; the holder reads the flag with
its release (atomically), and after clearing a flag reads the database
again.  Whatever the interleaving, either the holder sees the waiter or
the waiter's second try finds the gate free and wakes the head of the
queue itself.

Delivery.  A woken message goes straight to this process's own worker
when it can, not through a broker queue that an idle consumer polls
with back-off (see :mod:`dramatiq_unique.broker.delivery`).

Recovery.  A wake-up can be lost: the holder was killed (its lock frees
itself after its lease), or a process died between claiming a row and
delivering it.  Every worker process runs a small watchdog thread that
reads the flags that came due (one Redis call per ``wake_interval``)
and wakes the head of any group whose gate is free; so a killed
holder's waiters start about one lease after it died.  A claimed row
whose message was never delivered stays ``queued`` with no message and
is the re-drive's to find, like any lost message.

For the re-drive (issue 4): call :func:`wake_orphans` once per pass.
It wakes the first parked job of every group of this app whose gate has
no live holder (and restores the Redis flags, in case Redis lost them).  The
re-drive must not send parked rows itself: exclude ``parked_on IS NOT
NULL`` from the pending rows it sends, or they would re-park at once.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any, NoReturn, Optional

import redis as redis_lib
from dramatiq.middleware import SkipMessage

from dramatiq_unique.broker.delivery import Delivery
from dramatiq_unique.context import MARKER
from dramatiq_unique.durable.messages import job_options
from dramatiq_unique.errors import DependencyUnavailable
from dramatiq_unique.guard import guarded
from dramatiq_unique.logs import PARKED, ParkedSkipFilter
from dramatiq_unique.observe import events
from dramatiq_unique.parking import rows
from dramatiq_unique.parking.deck import OnDeck
from dramatiq_unique.parking.flags import Flags, Watchdog
from dramatiq_unique.parking.gates import KEPT, NOT_HELD, WAKE, Gate, gate_ttl
from dramatiq_unique.parking.prestart import Started
from dramatiq_unique.parking.waking import DEFAULT_PAGE, Waking
from dramatiq_unique.storage import jobs
from dramatiq_unique.storage.models import JobModel, utcnow

if TYPE_CHECKING:
    import dramatiq

    from dramatiq_unique.suite import ActorConfig, Suite

logger = logging.getLogger(__name__)

#: ms between two looks of a worker's watchdog at the groups whose holder's lease ran out.
DEFAULT_WAKE_INTERVAL = 500


class Parking(Waking):
    """Parking for one suite: gates, Redis flags, delivery and the watchdog (waking: :class:`Waking`).

    Get it with :func:`of`.  Thread-safe: worker threads, the watchdog
    and the re-drive call it at once.
    """

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
        """From ``before_process_message``: park the message's job on ``group``.  Always raises SkipMessage.

        A message sent without the suite gets its row first (so does one
        whose row was pruned).  A message whose job is not waiting (a
        duplicate delivery of a running job, a finished or replaced one)
        is dropped; it hands on a gate it was woken for (its execution lock,
        when it found its slot group full), not to sit on it until its lease
        runs out.  A waiting one does so in :meth:`park`.
        """
        with guarded(f"parking job {message.message_id}"):
            job_id, revision = rows.job_row(config, message, unique_key)
            waiting = self.park(gate, group, message, config.model, job_id, revision, retry_in_ms)
            if not waiting and jobs.get(config.model, id=job_id) is None:
                message.options.pop(MARKER, None)
                job_id, revision = rows.job_row(config, message, unique_key)
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
        """Park ``message``'s job on ``group``; False if the job is not waiting.

        Not waiting means another delivery of the same job is running (a
        duplicate), or it finished or was replaced: the caller drops the
        message.  On True the caller acks the message without running it.
        """
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
    """For the re-drive: wake parked jobs whose gate has no live holder (a lost wake-up).

    Safe to call from any process at any time: a group whose gate is
    held is left to its holder, and claims are compare-and-set.
    Returns the number of jobs woken.
    """
    return of(suite).wake_orphans(limit)


def orphaned_groups(suite: "Suite", *, limit: int = DEFAULT_PAGE) -> list[str]:
    """Groups of this app with parked jobs whose gate has no live holder (read only: what
    :func:`wake_orphans` would wake; the ``check`` command reports them)."""
    return of(suite).orphans(limit)
