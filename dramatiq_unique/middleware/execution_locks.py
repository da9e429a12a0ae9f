"""Execution locks: one running job per key, waiting jobs parked, leases fenced.

The Dramatiq hooks; the lock as a parking gate is :mod:`dramatiq_unique.locks.execution`.
"""

from __future__ import annotations

import logging
from typing import ClassVar, NoReturn, Optional

from dramatiq import Middleware

from dramatiq_unique import context, leases
from dramatiq_unique import options as opt
from dramatiq_unique.context import MARKER
from dramatiq_unique.errors import RedisUnavailable
from dramatiq_unique.guard import hook
from dramatiq_unique.locks.execution import Held, LockGate
from dramatiq_unique.locks.redlock import new_token
from dramatiq_unique.middleware import combinations
from dramatiq_unique.observe import events
from dramatiq_unique.parking import lot
from dramatiq_unique.parking.gates import WAKE
from dramatiq_unique.parking.groups import lock_group
from dramatiq_unique.storage.database import DB_ERRORS
from dramatiq_unique.storage.models import create_fence_table
from dramatiq_unique.suite import ActorConfig, Suite
from dramatiq_unique.unique.keys import derive_key

logger = logging.getLogger(__name__)

#: ``ctx.extras`` key of the execution lock an attempt holds.
HELD = "execution_lock"



class ExecutionLocks(Middleware):
    """Holds an execution lock while a ``while_executing`` or
    ``until_and_while_executing`` job runs, one job per unique key.

    A message whose key is locked is parked (see
    :mod:`dramatiq_unique.parking.lot`): acked without running, its row
    ``pending``, and woken by the holder when it finishes, in
    ``unique_order_by`` order.  Each acquisition draws the key's next
    fencing token (:func:`dramatiq_unique.storage.jobs.draw_token`), which the attempt's
    row carries.  ``unique_ttl`` is the lock's lease; ``heartbeat()``
    renews it.  If Redis cannot be reached the message fails with
    :class:`~dramatiq_unique.errors.RedisUnavailable` and Retries sends
    it again later: it never runs unlocked.

    Add it before :class:`JobTracking`: its ``before_process_message``
    then takes the lock before the row is marked running (the row gets
    the lock's fencing token), and its ``after_process_message`` hands
    the lock on after JobTracking recorded the outcome.  It needs
    JobTracking: a parked job waits on its row, and the fencing token
    lives there; an actor that takes an execution lock is refused when it
    is declared on a broker without JobTracking, or with it out of order.

    Parameters:
      suite: the configuration that :func:`dramatiq_unique.setup` returns.
      local_handoff: deliver a woken job to this process's own worker
        rather than through the broker (see :mod:`dramatiq_unique.parking.lot`).
    """

    #: Names this middleware where the suite checks which of its middlewares a broker has.
    capability: ClassVar[str] = combinations.LOCKS

    def __init__(self, *, suite: Suite, local_handoff: bool = True) -> None:
        self.suite = suite
        self.parking = lot.of(suite)
        self.parking.local_handoff = local_handoff
        self.gate = LockGate(suite, self.parking.flags)
        self.parking.register(self.gate)
        try:
            create_fence_table(suite.db)
        except DB_ERRORS:
            if not suite.stores.several:
                raise
            # The primary is down at set-up: its fencing table is made when it first answers.
            suite.stores.later(0, lambda: create_fence_table(suite.db))

    @property
    def actor_options(self) -> set[str]:
        return set(opt.LOCK_OPTIONS)

    @hook
    def before_declare_actor(self, broker, actor) -> None:
        combinations.check_actor(broker, actor)
        if opt.is_tracked(actor.options):
            leases.carry_context(actor)

    def after_worker_boot(self, broker, worker) -> None:
        self.parking.attach(worker)

    def before_worker_shutdown(self, broker, worker) -> None:
        self.parking.detach(worker)

    # -- processing ---------------------------------------------------------

    @hook
    def before_process_message(self, broker, message) -> None:
        config = self.suite.actor_config(message.actor_name)
        if config is None or message.failed:
            return
        opts = message.options
        spec = config.get(opts, "unique_args")
        if spec is None or config.get(opts, "unique_lock", opt.DEFAULT_UNIQUE_LOCK) not in opt.EXECUTION_LOCKS:
            return
        ctx = context.attach(message, self.suite, config)
        key = derive_key(config.actor_name, config.fn, spec, message.args, message.kwargs)
        assert key is not None
        group = lock_group(key)
        name = self.gate.name(group)
        ttl = float(config.get(opts, "unique_ttl", opt.DEFAULT_UNIQUE_TTL))
        marker = opts.get(MARKER)
        wake = marker.get(WAKE) if isinstance(marker, dict) else None
        if isinstance(wake, dict) and wake.get("g") == group:
            del marker[WAKE]  # woken for this lock: it was handed to us (another gate's stays)
            events.taken_up(self.gate.kind, message, marker, wake)
            ctx.extras[context.WOKEN] = True
        else:
            wake = None
        token = self._enter(name, group, ttl, wake)
        if token is None:
            self._park(config, message, key, group, ttl)
        # JobTracking draws the key's fencing token as it starts the attempt: on
        # PostgreSQL in the same statement, one synchronous commit fewer per job.
        ctx.extras["fence_key"] = key
        held = Held(self.suite.locks, name, group, token, ttl)
        ctx.extras[HELD] = held
        ctx.extras.setdefault(leases.RENEWERS, []).append(held.renew)

    def _enter(self, name: str, group: str, ttl: float, wake: Optional[dict]) -> Optional[str]:
        """Take the lock: the one reserved for this message when it was woken, or a free one."""
        token = new_token()
        if wake and self.suite.locks.transfer(name, wake["t"], token, ttl):
            return token
        return self.suite.locks.acquire(name, ttl, token)[0]

    def _park(self, config: ActorConfig, message, key: str, group: str, ttl: float) -> NoReturn:
        """The key is locked: park the job until the holder wakes it.  Always raises SkipMessage."""
        try:
            retry_in = self.gate.retry_in(group)
        except RedisUnavailable:
            retry_in = ttl
        self.parking.park_message(self.gate, group, config, message, retry_in, unique_key=key)

    def after_process_message(self, broker, message, *, result=None, exception=None) -> None:
        self._leave(message)

    def after_skip_message(self, broker, message) -> None:
        self._leave(message)  # JobTracking skipped a duplicate after we took the lock

    def _leave(self, message) -> None:
        ctx = context.of(message)
        held = ctx.extras.pop(HELD, None) if ctx is not None else None
        if held is None:
            return
        try:
            self.parking.leave(self.gate, held.group, held.token)
        except Exception:
            logger.exception("Could not hand on the execution lock of %s; it frees itself.", held.group)
