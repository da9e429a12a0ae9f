"""Execution locks: one running job per unique key, waiting jobs parked, leases fenced."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, ClassVar, Optional

from dramatiq_unique import options as opt
from dramatiq_unique.context import Held
from dramatiq_unique.errors import RedisUnavailable
from dramatiq_unique.locks.redlock import new_token
from dramatiq_unique.middleware.gates import GateMiddleware
from dramatiq_unique.parking.gates import GroupInfo
from dramatiq_unique.parking.groups import LOCK, actor_of, lock_group, unique_key_of
from dramatiq_unique.storage.database import DB_ERRORS
from dramatiq_unique.storage.models import create_fence_table
from dramatiq_unique.suite import ActorConfig, Suite
from dramatiq_unique.unique.keys import derive_key

if TYPE_CHECKING:
    from dramatiq_unique.context import JobContext


class LockGate:
    """Execution locks as a parking :class:`~dramatiq_unique.parking.gates.Gate`: group ``lock:<unique key>``,
    a Redlock named after the key (:mod:`dramatiq_unique.locks.redlock`)."""

    kind = LOCK
    lost = "the execution lock of {} ran out or was taken"

    def __init__(self, suite: Suite, flags: str) -> None:
        self.suite = suite
        self.flags = flags
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

    def release_unless_flagged(self, group: str, token: str) -> int:
        return self.suite.locks.release_unless(self.name(group), token, self.flags, group)

    def release(self, group: str, token: str) -> None:
        self.suite.locks.release(self.name(group), token)

    def retry_in(self, group: str) -> float:
        return self.suite.locks.pttl(self.name(group))

    def renew(self, group: str, token: str, ttl_ms: float, limit: int = -1) -> bool:
        return self.suite.locks.extend(self.name(group), token, ttl_ms)


class ExecutionLocks(GateMiddleware):
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

    capability: ClassVar[str] = opt.LOCKS
    options: ClassVar[frozenset] = opt.LOCK_OPTIONS
    gate: LockGate

    def __init__(self, *, suite: Suite, local_handoff: bool = True) -> None:
        super().__init__(suite=suite, local_handoff=local_handoff)
        self.gate = LockGate(suite, self.parking.flags)
        self.parking.register(self.gate)
        try:
            create_fence_table(suite.db)
        except DB_ERRORS:
            if not suite.stores.several:
                raise
            # The primary is down at set-up: its fencing table is made when it first answers.
            suite.stores.later(0, lambda: create_fence_table(suite.db))

    def applies(self, config: ActorConfig) -> bool:
        return config.execution_lock

    def enter(self, ctx: "JobContext", message: Any) -> None:
        config = ctx.config
        key = derive_key(config.actor_name, config.fn, config.unique_args, message.args, message.kwargs)
        assert key is not None
        group = lock_group(key)
        name, ttl = self.gate.name(group), config.unique_ttl
        wake = self.take_up(ctx, message, group)
        fresh = new_token()
        ctx.lock_asked = time.monotonic()
        if wake and self.suite.locks.transfer(name, wake["t"], fresh, ttl):  # handed to us when woken
            token: Optional[str] = fresh
        else:
            token = self.suite.locks.acquire(name, ttl, fresh)[0]
        if token is None:
            try:
                retry_in = self.gate.retry_in(group)
            except RedisUnavailable:
                retry_in = ttl
            self.park(config, message, group, retry_in, unique_key=key)
        # JobTracking draws the key's fencing token as it starts the attempt: on
        # PostgreSQL in the same statement, one synchronous commit fewer per job.
        ctx.fence_key = key
        self.hold(ctx, Held(self.gate, group, token, ttl))
