"""Waking parked jobs: the holder's side of :mod:`dramatiq_unique.parking.lot`.

A holder that leaves a gate with waiters, a waiter that found the gate
free on its second look, the watchdog and the re-drive all wake the next
job of a group the same way (:meth:`Waking.pass_on`): a job on deck first
(:mod:`dramatiq_unique.parking.deck`), else the next due parked row, claimed
with a compare-and-set, given the gate under a token and delivered.
:class:`~dramatiq_unique.parking.lot.Parking` is a :class:`Waking`.
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import TYPE_CHECKING, Optional

import redis as redis_lib

from dramatiq_unique.durable.messages import rebuild
from dramatiq_unique.errors import DependencyUnavailable
from dramatiq_unique.observe import events
from dramatiq_unique.parking import rows
from dramatiq_unique.parking.gates import KEPT, RELEASED, WAKE, Gate, GroupInfo, gate_ttl
from dramatiq_unique.parking.groups import kind_of
from dramatiq_unique.storage import jobs
from dramatiq_unique.storage.models import JobModel, JobStatus, after_ms, utcnow

if TYPE_CHECKING:
    from dramatiq_unique.broker.delivery import Delivery
    from dramatiq_unique.parking.deck import OnDeck
    from dramatiq_unique.parking.flags import Flags
    from dramatiq_unique.parking.prestart import Started
    from dramatiq_unique.suite import Suite

logger = logging.getLogger(__name__)

#: Flags looked at per watchdog pass, and groups per :func:`~dramatiq_unique.parking.lot.wake_orphans` call.
DEFAULT_PAGE = 100
#: Bound on compare-and-set rounds lost to other wakers.
MAX_ROUNDS = 20
#: ms before a group whose wake-up failed (or that no gate here knows) is looked at again.
RETRY_DELAY = 5_000


class Waking:
    """The wake-up half of a :class:`~dramatiq_unique.parking.lot.Parking`."""

    suite: "Suite"
    #: The gates jobs park on, by kind (:mod:`dramatiq_unique.parking.groups`).
    gates: dict[str, Gate]
    wakeups: "Flags"
    delivery: "Delivery"
    ondeck: "OnDeck"
    started: "Started"

    def gate_for(self, group: str) -> Optional[Gate]:
        """The gate ``group``'s jobs park on; None if no gate of its kind is registered here."""
        return self.gates.get(kind_of(group))

    def pass_on(self, gate: Gate, group: str, token: str, fresh: bool = False) -> Optional[JobModel]:
        """Holding ``group``'s gate under ``token``: wake the next parked job, or release the gate.

        ``fresh``: the token was just issued and is in no message yet, so
        the woken job may have it as it is (no re-issue).  Returns the
        woken row, or None if the gate was released (or lost).  Errors are
        logged, the gate released and the group left flagged for the
        watchdog to try again.
        """
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
                    # Who granted it and when (monotonic ms): a job woken in this process soon after
                    # may take up its reservation without asking Redis again (ConcurrencySlots).
                    wake = {"g": group, "t": grant, "w": self.suite.worker_id, "at": int(time.monotonic() * 1000),
                            events.HANDED_AT: events.now_ms()}
                    try:
                        self.delivery.send(rebuild(row, {WAKE: wake}), row.broker_ref)
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
                waiting = rows.waiting_in(info, group, app=self.suite.app)
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

