"""Concurrency slots: at most N jobs of a group at once, the rest parked.

The Dramatiq hooks; the slots as a parking gate are :mod:`dramatiq_unique.slots.gate`.
"""

from __future__ import annotations

import logging
import time
from typing import Any, ClassVar, NoReturn, Optional

from dramatiq import Middleware
from dramatiq.middleware import SkipMessage

from dramatiq_unique import context, leases
from dramatiq_unique import options as opt
from dramatiq_unique.context import MARKER
from dramatiq_unique.guard import guarded, hook
from dramatiq_unique.locks.redlock import new_token
from dramatiq_unique.middleware import combinations
from dramatiq_unique.observe import events
from dramatiq_unique.parking import lot
from dramatiq_unique.parking.gates import WAKE
from dramatiq_unique.parking.groups import slot_group
from dramatiq_unique.slots import overrides
from dramatiq_unique.slots.gate import HeldSlot, declared_limit, gate_of, group_key, has_slots, ttl_of
from dramatiq_unique.storage import jobs
from dramatiq_unique.storage.models import after_ms
from dramatiq_unique.suite import ActorConfig, Suite

logger = logging.getLogger(__name__)

#: ``ctx.extras`` key of the slot an attempt holds.
HELD = "concurrency_slot"


class ConcurrencySlots(Middleware):
    """Runs at most ``concurrency_limit`` jobs of an actor at once, per
    value of its ``concurrency_key`` (or per actor without one), across
    every worker sharing the Redis.

    A job whose group is full is parked (see :mod:`dramatiq_unique.parking.lot`):
    acked without running, holding no thread and burning no retry, its
    row ``pending``; a job that leaves its slot hands it to the group's
    next parked job (``unique_order_by`` order, ``created_at`` by
    default).  Slots are leased for ``concurrency_ttl``; ``heartbeat()``
    renews the lease, and a holder that died loses its slot when the
    lease runs out.  Limits can be changed at run time with
    :func:`dramatiq_unique.set_concurrency_limit`.  If Redis cannot be
    reached the message fails with
    :class:`~dramatiq_unique.errors.RedisUnavailable` and Retries sends it
    again later: it never runs unlimited.

    Add it before :class:`ExecutionLocks` (which goes before
    :class:`JobTracking`): a job takes its slot first, then its execution
    lock, then its row is marked running; on the way out, the slot is
    handed on first (JobTracking does it before it writes the outcome: a
    slot orders nothing, so the next job need not wait for that commit),
    then the outcome is recorded, then the lock is handed on.  A job that has
    a slot but must wait for its execution lock gives the slot to the
    next job of its group while it waits, and a job woken for its lock
    that finds its group full hands the lock on while it waits for a slot.
    Without ExecutionLocks it limits jobs alone.  It needs JobTracking: a
    parked job waits on its row; an actor with a concurrency option is
    refused when it is declared on a broker without JobTracking, or with
    the middlewares out of order.

    Parameters:
      suite: the configuration that :func:`dramatiq_unique.setup` returns.
      local_handoff: deliver a woken job to this process's own worker rather than
        through the broker (see :mod:`dramatiq_unique.parking.lot`); the parking is
        shared with ExecutionLocks, so None leaves it as that one set it (True by default).
    """

    #: Names this middleware where the suite checks which of its middlewares a broker has.
    capability: ClassVar[str] = combinations.SLOTS

    def __init__(self, *, suite: Suite, local_handoff: Optional[bool] = None) -> None:
        self.suite = suite
        self.parking = lot.of(suite)
        if local_handoff is not None:
            self.parking.local_handoff = local_handoff
        self.gate = gate_of(suite)
        overrides.open_table(suite)  # the run-time limits are kept there (slots/overrides.py)

    @property
    def actor_options(self) -> set[str]:
        return set(opt.SLOT_OPTIONS)

    @hook
    def before_declare_actor(self, broker, actor) -> None:
        combinations.check_actor(broker, actor)

    def after_worker_boot(self, broker, worker) -> None:
        self.parking.attach(worker)  # idempotent: ExecutionLocks shares this parking

    def before_worker_shutdown(self, broker, worker) -> None:
        self.parking.detach(worker)

    # -- processing ---------------------------------------------------------

    @hook
    def before_process_message(self, broker, message) -> None:
        config = self.suite.actor_config(message.actor_name)
        if config is None or message.failed:
            return
        opts = message.options
        if not has_slots(config, opts):
            return
        self._enter(config, message)

    def _enter(self, config: ActorConfig, message) -> None:
        opts = message.options
        ctx = context.attach(message, self.suite, config)
        group = slot_group(group_key(config, opts, message.args, message.kwargs))
        ttl, limit = ttl_of(config, opts), declared_limit(config, opts)
        marker = opts.get(MARKER)
        wake = marker.get(WAKE) if isinstance(marker, dict) else None
        reserved, started = None, None
        if isinstance(wake, dict) and wake.get("g") == group:
            reserved = marker.pop(WAKE)["t"]  # woken for this slot: it was handed to us
            events.taken_up(self.gate.kind, message, marker, wake)
            ctx.extras[context.WOKEN] = True
            if wake.get("w") == self.suite.worker_id:  # woken here: its claim (or the deck) may have started it
                started = self.parking.started.take(message.message_id, int(marker.get("rev", 0)))
        if reserved is not None and self._fresh_here(wake, ttl):
            # Granted by this process a moment ago, its lease barely begun: it is ours,
            # without asking Redis again (one round trip off every local hand-over).
            token = reserved
        else:
            token = new_token()
            own = opts.get("concurrency_limit")  # a message's own limit: the gate must know it too
            if reserved is None and own is None and self.parking.ondeck.busy(group):
                # Jobs of the group wait on deck here, so it is full: queue up behind them without
                # asking first (parking looks at the slots once more, and wakes the head if one is free).
                self._park(config, message, group, ttl)
            entered, wait = self.gate.enter(group, token, ttl, limit, reserved, own)
            if not entered:
                if started is not None:  # its start is undone: it waits parked, as not started
                    with guarded(f"parking job {message.message_id}"):
                        jobs.unstart(config.model, started, group)
                self._park(config, message, group, ttl if wait < 0 else wait)
            if started is not None:
                started = self._still_ours(config, message, group, token, started)
        if started is not None:  # its claim started the attempt: JobTracking uses that row
            ctx.extras[context.STARTED] = started
        held = HeldSlot(self.gate, group, token, ttl, limit)
        ctx.extras[HELD] = held
        self.parking.ondeck.holding(group, 1)
        ctx.extras.setdefault(leases.RENEWERS, []).append(held.renew)
        # The slot goes to the next job as soon as the actor is done, before the outcome
        # is written: a slot orders nothing, so the next job need not wait for that commit.
        ctx.extras.setdefault(context.BEFORE_RECORD, []).append(lambda: self._leave(message))

    def _still_ours(self, config: ActorConfig, message, group: str, token: str, started: Any) -> Any:
        """A job started by its claim (or the deck) and picked up late, in the slot ``token``: it
        runs under that start only if its row still carries the start's fencing token (its lease
        renewed, by a fenced write); else another attempt took the job over (this process stalled
        past the lease): the message is dropped and the slot handed on."""
        lease = after_ms(float(config.get(message.options, "unique_ttl", opt.DEFAULT_UNIQUE_TTL)))
        with guarded(f"starting job {message.message_id}"):
            renewed = jobs.update_fenced(config.model, started.id, started.fencing_token, {"lease_until": lease})
        if renewed:
            started.__data__["lease_until"] = lease
            return started
        self.parking.leave(self.gate, group, token)
        raise SkipMessage(f"job {message.message_id} was taken over by another attempt while it waited")

    def _fresh_here(self, wake: Any, ttl_ms: float) -> bool:
        """Whether a reservation was granted by this very process (same host and pid, so the
        same monotonic clock) within the first tenth of the slot's lease."""
        granted = wake.get("at")
        if wake.get("w") != self.suite.worker_id or not isinstance(granted, int):
            return False
        return 0 <= time.monotonic() * 1000 - granted < ttl_ms / 10

    def _park(self, config: ActorConfig, message, group: str, retry_in: float) -> NoReturn:
        """The group is full: park the job until a holder hands it a slot.  Always raises SkipMessage.

        A job woken for another gate (its execution lock) gives that gate
        to its next waiter when it parks here (parking does), so it does
        not sit on it while it waits for a slot.
        """
        self.parking.park_message(self.gate, group, config, message, retry_in)

    def after_process_message(self, broker, message, *, result=None, exception=None) -> None:
        self._leave(message)

    def after_skip_message(self, broker, message) -> None:
        self._leave(message)  # a later middleware parked or skipped the job after we took its slot

    def _leave(self, message: Any) -> None:
        ctx = context.of(message)
        held: Optional[HeldSlot] = ctx.extras.pop(HELD, None) if ctx is not None else None
        if held is None:
            return
        self.parking.ondeck.holding(held.group, -1)
        try:
            self.parking.leave(self.gate, held.group, held.token)
        except Exception:
            logger.exception("Could not hand on a slot of %s; it frees itself when its lease runs out.", held.group)
