"""ConcurrencySlots: at most ``concurrency_limit`` jobs of a group at once, a freed slot handed to the
group's next parked job."""

from __future__ import annotations

import logging
import time
from typing import Any, ClassVar, Optional

from dramatiq.middleware import SkipMessage

from dramatiq_unique import options as opt
from dramatiq_unique.context import MARKER, Held, JobContext
from dramatiq_unique.guard import guarded
from dramatiq_unique.leases import GateMiddleware
from dramatiq_unique.locks.redlock import new_token
from dramatiq_unique.parking.groups import slot_group
from dramatiq_unique.slots import overrides
from dramatiq_unique.slots.gate import SlotGate, declared_limit, gate_of, group_key
from dramatiq_unique.storage import jobs
from dramatiq_unique.storage.models import JobModel, after_ms
from dramatiq_unique.suite import ActorConfig, Suite

logger = logging.getLogger(__name__)


class ConcurrencySlots(GateMiddleware):
    """Runs at most ``concurrency_limit`` jobs of an actor at once, per value of its ``concurrency_key`` (or
    per actor without one), across every worker sharing the Redis.

    A job whose group is full is parked: acked without running, holding no thread and burning no retry, its row
    ``pending``; a job that leaves its slot hands it to the group's next parked job (``unique_order_by`` order).  Slots
    are leased for ``concurrency_ttl``; ``heartbeat()`` renews the lease, and a holder that died loses its slot when
    the lease runs out.  Limits can be changed at run time with :func:`dramatiq_unique.set_concurrency_limit`. If Redis
    cannot be reached the message fails with :class:`~dramatiq_unique.errors.RedisUnavailable` and Retries sends it
    again later: it never runs unlimited.

    Add it before :class:`ExecutionLocks` (which goes before :class:`JobTracking`): a job takes its slot, then its
    execution lock, then its row is marked running; on the way out the slot is handed on first (a slot orders nothing:
    the next job need not wait for the outcome's commit), then the outcome is recorded, then the lock is handed on.  A
    job that waits for one gate hands the other on meanwhile.  It needs JobTracking: an actor with a concurrency option
    is refused when it is declared on a broker without JobTracking, or with the middlewares out of order.

    Parameters:
      suite: the configuration that :func:`dramatiq_unique.setup` returns.
      local_handoff: deliver a woken job to this process's own worker rather than through the broker; the
        parking is shared with ExecutionLocks, so None leaves it as that one set it (True by default).
    """

    capability: ClassVar[str] = opt.SLOTS
    options: ClassVar[frozenset] = opt.SLOT_OPTIONS
    takes: ClassVar[str] = "has_slots"
    gate: SlotGate

    def __init__(self, *, suite: Suite, local_handoff: Optional[bool] = None) -> None:
        super().__init__(suite=suite, local_handoff=local_handoff)
        self.gate = gate_of(suite)
        overrides.open_table(suite)  # the run-time limits are kept there

    def enter(self, ctx: JobContext, message: Any) -> Held:
        config, opts = ctx.config, message.options
        group = slot_group(group_key(config, {}, message.args, message.kwargs))
        ttl, limit = config.concurrency_ttl, declared_limit(config)
        wake = self.take_up(ctx, message, group)
        reserved = None if wake is None else wake["t"]
        started: Optional[JobModel] = None
        if wake is not None and wake.get("w") == self.suite.worker_id:
            # Woken here: its claim (or the deck) may have started it.
            started = self.parking.started.take(message.message_id, int(opts[MARKER].get("rev", 0)))
        if reserved is not None and self._fresh_here(wake, ttl):
            # Granted by this process a moment ago, its lease barely begun: it is ours,
            # without asking Redis again (one round trip off every local hand-over).
            token = reserved
        else:
            token = new_token()
            own = opts.get("concurrency_limit")  # a message's own limit: the gate must know it too
            if reserved is None and own is None and self.parking.ondeck.places.busy(group):
                # Jobs of the group wait on deck here, so it is full: queue up behind them without
                # asking first (parking looks at the slots once more, and wakes the head if one is free).
                self.parking.park_message(self.gate, group, config, message, ttl)
            entered, wait = self.gate.enter(group, token, ttl, limit, reserved, own)
            if not entered:
                if started is not None:  # its start is undone: it waits parked, as not started
                    with guarded(f"parking job {message.message_id}"):
                        jobs.unstart(config.model, started, group)
                self.parking.park_message(self.gate, group, config, message, ttl if wait < 0 else wait)
            if started is not None:
                started = self._still_ours(config, message, group, token, started)
        ctx.started = started  # its claim started the attempt: JobTracking uses that row
        self.parking.ondeck.places.holding(group, 1)
        ctx.before_record.append(lambda: self.leave(message))  # handed on before the outcome is written
        return Held(self.gate, group, token, ttl, limit)

    def _still_ours(self, config: ActorConfig, message: Any, group: str, token: str, started: JobModel) -> JobModel:
        """A job started by its claim (or the deck) and picked up late runs under that start only if its
        row still carries the start's fencing token (its lease renewed, by a fenced write); else another
        attempt took the job over: the message is dropped and the slot handed on."""
        lease = after_ms(config.unique_ttl)
        with guarded(f"starting job {message.message_id}"):
            renewed = jobs.update_fenced(config.model, started.id, started.fencing_token, {"lease_until": lease})
        if renewed:
            started.__data__["lease_until"] = lease
            return started
        self.parking.leave(self.gate, group, token)
        raise SkipMessage(f"job {message.message_id} was taken over by another attempt while it waited")

    def _fresh_here(self, wake: Any, ttl_ms: float) -> bool:
        """Whether a reservation was granted by this very process (same monotonic clock) within
        the first tenth of the slot's lease."""
        granted = wake.get("at")
        if wake.get("w") != self.suite.worker_id or not isinstance(granted, int):
            return False
        return 0 <= time.monotonic() * 1000 - granted < ttl_ms / 10

    def leaving(self, held: Held) -> None:
        self.parking.ondeck.places.holding(held.group, -1)
