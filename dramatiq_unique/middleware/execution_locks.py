"""ExecutionLocks: one job per unique key at a time, the key's lock handed to its next parked job."""

from __future__ import annotations

import logging
import time
from typing import Any, ClassVar, Optional

import redis as redis_lib

from dramatiq_unique import options as opt
from dramatiq_unique.context import Held, JobContext
from dramatiq_unique.errors import RedisUnavailable
from dramatiq_unique.leases import GateMiddleware
from dramatiq_unique.locks.redlock import new_token
from dramatiq_unique.parking import lot
from dramatiq_unique.parking.gates import GroupInfo
from dramatiq_unique.parking.groups import LOCK, actor_of, lock_group, unique_key_of
from dramatiq_unique.storage.database import DB_ERRORS
from dramatiq_unique.storage.models import create_fence_table
from dramatiq_unique.suite import Suite
from dramatiq_unique.unique.keys import derive_key

logger = logging.getLogger(__name__)


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

    def release_unless_flagged(self, group: str, token: str) -> int:
        return self.suite.locks.release_unless(self.name(group), token, self.wakeups.key, group)

    def hand_over(self, group: str, token: str) -> tuple[int, str]:
        return self.release_unless_flagged(group, token), token

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
    options: ClassVar[frozenset] = opt.LOCK_OPTIONS
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
        ctx.lock_asked = time.monotonic()
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
