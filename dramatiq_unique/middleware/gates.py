"""The gate middlewares: :class:`ExecutionLocks` (one job per unique key at a time, the key's lock handed
to its next parked job) and :class:`ConcurrencySlots` (at most ``concurrency_limit`` jobs of a group at
once, a freed slot handed to the group's next parked job), over their base :class:`GateMiddleware`."""

from __future__ import annotations

import logging
import time
from typing import Any, ClassVar, Optional

import redis as redis_lib
from dramatiq import Middleware
from dramatiq.middleware import SkipMessage

from dramatiq_unique import context
from dramatiq_unique import options as opt
from dramatiq_unique.context import MARKER, Held, JobContext, carry_context
from dramatiq_unique.errors import RedisUnavailable
from dramatiq_unique.guard import guarded, hook
from dramatiq_unique.locks.redlock import new_token
from dramatiq_unique.observe import events
from dramatiq_unique.parking import lot
from dramatiq_unique.parking.groups import LOCK, WAKE, Gate, GroupInfo, actor_of, lock_group, slot_group, unique_key_of
from dramatiq_unique.slots import overrides
from dramatiq_unique.slots.gate import SlotGate, declared_limit, gate_of, group_key
from dramatiq_unique.storage import jobs
from dramatiq_unique.storage.database import DB_ERRORS
from dramatiq_unique.storage.models import JobModel, after_ms, create_fence_table
from dramatiq_unique.suite import ActorConfig, Suite
from dramatiq_unique.unique.keys import derive_key

logger = logging.getLogger(__name__)


class GateMiddleware(Middleware):
    """Takes a gate in ``before_process_message`` (:meth:`enter`), hands it on when the job is done.
    Both gate middlewares share the suite's parking and its watchdog."""

    #: Names the middleware where the suite checks which of its middlewares a broker has.
    capability: ClassVar[str]
    #: The ActorConfig property that says whether a job (with its message's own options) takes the gate.
    takes: ClassVar[str]
    gate: Gate

    def __init__(self, *, suite: Suite, local_handoff: Optional[bool] = None) -> None:
        self.suite = suite
        self.parking = lot.of(suite)
        if local_handoff is not None:  # None leaves it as the other gate middleware set it
            self.parking.delivery.local = local_handoff

    @hook
    def before_declare_actor(self, broker, actor) -> None:
        opt.check_actor(broker, actor)
        if opt.is_tracked(actor.options):
            carry_context(actor)

    def after_worker_boot(self, broker, worker) -> None:
        self.parking.attach(worker)  # idempotent: both gate middlewares share the parking

    def before_worker_shutdown(self, broker, worker) -> None:
        self.parking.detach(worker)

    @hook
    def before_process_message(self, broker, message) -> None:
        config = self.suite.actor_config(message.actor_name)
        if config is None or message.failed:
            return
        ctx = context.attach(message, self.suite, config)  # JobTracking's too
        if getattr(ctx.config, self.takes):
            ctx.held[self.gate.kind] = self.enter(ctx, message)

    def enter(self, ctx: JobContext, message: Any) -> Held:
        """Take the gate for the attempt, or park the job (``parking.park_message`` raises SkipMessage)."""
        raise NotImplementedError

    def take_up(self, ctx: JobContext, message: Any, group: str) -> Optional[dict]:
        """The reservation of ``group``'s gate that woke this message, taken off its marker (another
        gate's stays for that gate); None if it was not woken for this gate."""
        marker = message.options.get(MARKER)
        wake = marker.get(WAKE) if isinstance(marker, dict) else None
        if not isinstance(wake, dict) or wake.get("g") != group:
            return None
        del marker[WAKE]
        events.taken_up(self.gate.kind, message, marker, wake)
        ctx.woken = True
        return wake

    def after_process_message(self, broker, message, *, result=None, exception=None) -> None:
        self.leave(message)

    # A later middleware may park or skip the job after it took the gate.
    after_skip_message = after_process_message

    def leave(self, message: Any) -> None:
        """Hand the attempt's gate to the next waiter, or release it."""
        ctx = context.of(message)
        held = ctx.held.pop(self.gate.kind, None) if ctx is not None else None
        if held is None:
            return
        self.leaving(held)
        self.parking.hand_on(held.group, held.token)

    def leaving(self, held: Held) -> None:
        """Called as the attempt lets go of ``held``, before it is handed on."""


class LockGate:
    """Execution locks as a parking gate: group ``lock:<unique key>``, a lock named after the key."""

    kind = LOCK
    lost = "the execution lock of {} ran out or was taken"

    def __init__(self, suite: Suite, wakeups: lot.Flags) -> None:
        self.suite = suite
        self.wakeups = wakeups
        self.atomic_release = suite.locks.single

    def name(self, group: str) -> str:
        return self.suite.keys.execution_lock(unique_key_of(group))

    def describe(self, group: str) -> Optional[GroupInfo]:
        config = self.suite.actor_config(actor_of(group))
        return None if config is None else GroupInfo(config.model, config.unique_order_by, config.unique_ttl)

    def take(self, group: str, ttl_ms: float) -> Optional[str]:
        return self.suite.locks.acquire(self.name(group), ttl_ms, new_token())[0]

    def pass_to(self, group: str, token: str, ttl_ms: float) -> Optional[str]:
        fresh = new_token()
        return fresh if self.suite.locks.transfer(self.name(group), token, fresh, ttl_ms) else None

    def hand_over(self, group: str, token: str) -> tuple[int, str]:
        return self.suite.locks.release_unless(self.name(group), token, self.wakeups.key, group), token

    def flag_and_take(self, group: str, ttl_ms: float, delay_ms: float) -> Optional[str]:
        try:
            self.wakeups.flag(group, delay_ms)
        except redis_lib.RedisError:
            logger.warning("Could not flag %s: its holder looks in the database for waiting jobs.", group)
        return self.take(group, ttl_ms)

    def release(self, group: str, token: str) -> None:
        self.suite.locks.release(self.name(group), token)

    def retry_in(self, group: str) -> float:
        return self.suite.locks.pttl(self.name(group))

    def renew(self, group: str, token: str, ttl_ms: float, limit: int = -1) -> bool:
        return self.suite.locks.extend(self.name(group), token, ttl_ms)


class ExecutionLocks(GateMiddleware):
    """Holds an execution lock while a ``while_executing`` or ``until_and_while_executing`` job runs, one
    job per unique key.

    A message whose key is locked is parked: acked without running, its row ``pending``, and woken by the
    holder when it finishes, in ``unique_order_by`` order.  Each acquisition draws the key's next fencing
    token, which the attempt's row carries.  ``unique_ttl`` is the lock's lease; ``heartbeat()`` renews it.
    If Redis cannot be reached the message fails with :class:`~dramatiq_unique.errors.RedisUnavailable` and
    Retries sends it again later: it never runs unlocked.

    Add it before :class:`JobTracking`, which it needs: the lock is taken before the row is marked running (the row
    gets the lock's fencing token), and handed on after the outcome is recorded.  An actor that takes an execution lock
    is refused when it is declared on a broker without JobTracking, or with it out of order.

    Parameters:
      suite: the configuration that :func:`dramatiq_unique.setup` returns.
      local_handoff: deliver a woken job to this process's own worker rather than through the broker.
    """

    capability: ClassVar[str] = opt.LOCKS
    #: The options it reads (Dramatiq refuses an option no middleware declares).
    actor_options = set(opt.LOCK_OPTIONS)
    takes: ClassVar[str] = "execution_lock"
    gate: LockGate

    def __init__(self, *, suite: Suite, local_handoff: bool = True) -> None:
        super().__init__(suite=suite, local_handoff=local_handoff)
        self.gate = LockGate(suite, self.parking.wakeups)
        self.parking.register(self.gate)
        try:
            create_fence_table(suite.db)
        except DB_ERRORS:
            if not suite.stores.several:
                raise
            # The primary is down at set-up: its fencing table is made when it first answers.
            suite.stores.later(0, lambda: create_fence_table(suite.db))

    def enter(self, ctx: JobContext, message: Any) -> Held:
        config = ctx.config
        key = derive_key(config.actor_name, config.fn, config.unique_args, message.args, message.kwargs)
        assert key is not None
        group = lock_group(key)
        ttl = config.unique_ttl
        wake = self.take_up(ctx, message, group)
        if ctx.asked is None:  # else a slot's claim started the row earlier: its lease runs from then
            ctx.asked = time.monotonic()
        token = self.gate.pass_to(group, wake["t"], ttl) if wake else None  # handed to us when woken
        token = token or self.gate.take(group, ttl)
        if token is None:
            try:
                retry_in = self.gate.retry_in(group)
            except RedisUnavailable:
                retry_in = ttl
            self.parking.park_message(self.gate, group, config, message, retry_in, unique_key=key)
        # JobTracking draws the key's fencing token as it starts the attempt: on
        # PostgreSQL in the same statement, one synchronous commit fewer per job.
        ctx.fence_key = key
        return Held(self.gate, group, token, ttl)


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
    actor_options = set(opt.SLOT_OPTIONS)
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
        asked: Optional[float] = None  # when the lease of the row started ahead was asked for
        if wake is not None and wake.get("w") == self.suite.worker_id:
            # Woken here: its claim (or the deck) may have started it.
            taken = self.parking.started.take(message.message_id, int(opts[MARKER].get("rev", 0)))
            if taken is not None:
                started, asked = taken
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
            asking = time.monotonic()
            entered, wait = self.gate.enter(group, token, ttl, limit, reserved, own)
            if entered and (time.monotonic() - asking) * 1000 >= ttl:
                # The reply came after the lease it granted ran out (a stalled link): the slot may be
                # another job's by now.  Let it go and wait parked, as for a full group.
                logger.warning("Job %s took a slot of %s whose lease ran out before the reply came (%.1f s); "
                               "it waits its turn again.", message.message_id, group, time.monotonic() - asking)
                self.parking.leave(self.gate, group, token)
                entered, wait = False, 0
            if not entered:
                if started is not None:  # its start is undone: it waits parked, as not started
                    with guarded(f"parking job {message.message_id}"):
                        jobs.unstart(config.model, started, group)
                self.parking.park_message(self.gate, group, config, message, ttl if wait < 0 else wait)
            if started is not None:
                asked = time.monotonic()
                started = self._still_ours(config, message, group, token, started)
        ctx.started = started  # its claim started the attempt: JobTracking uses that row
        if started is not None:
            ctx.asked = asked  # JobTracking lets it run only within the lease from then
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
        the first tenth of the slot's lease, counted from before the grant and its claim's start
        were asked for: a reply that came late does not make a reservation fresh."""
        granted = wake.get("at")
        if wake.get("w") != self.suite.worker_id or not isinstance(granted, int):
            return False
        return 0 <= time.monotonic() * 1000 - granted < ttl_ms / 10

    def leaving(self, held: Held) -> None:
        self.parking.ondeck.places.holding(held.group, -1)
