"""The execution lock as a parking gate: one running job per unique key.

A job whose unique key's execution lock is held parks on the group
``lock:<unique key>`` (see :mod:`dramatiq_unique.parking.lot`); the
holder hands the lock to the group's next job when it leaves.  The
lock is a Redlock (:mod:`dramatiq_unique.locks.redlock`) named after the
unique key; :class:`~dramatiq_unique.middleware.ExecutionLocks` takes
and leaves it from Dramatiq's hooks.
"""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING, Any, Optional

from dramatiq_unique import options as opt
from dramatiq_unique.errors import LockLost
from dramatiq_unique.locks.redlock import new_token
from dramatiq_unique.parking.gates import GroupInfo
from dramatiq_unique.parking.groups import LOCK, actor_of, unique_key_of

if TYPE_CHECKING:
    from dramatiq_unique.suite import Suite

@dataclasses.dataclass
class Held:
    """An execution lock held by one attempt."""

    locks: Any
    name: str
    group: str
    token: str
    ttl_ms: float

    def renew(self) -> float:
        """heartbeat(): extend the lease to a full ``ttl_ms``; the seconds left."""
        started = time.monotonic()
        if not self.locks.extend(self.name, self.token, self.ttl_ms):
            raise LockLost(f"the execution lock of {self.group} ran out or was taken")
        return self.ttl_ms / 1000 - (time.monotonic() - started)


class LockGate:
    """Execution locks as a parking :class:`~dramatiq_unique.parking.gates.Gate`: group ``lock:<unique key>``."""

    kind = LOCK

    def __init__(self, suite: "Suite", flags: str) -> None:
        self.suite = suite
        self.flags = flags
        self.atomic_release = suite.locks.single

    def name(self, group: str) -> str:
        return self.suite.keys.execution_lock(unique_key_of(group))

    def describe(self, group: str) -> Optional[GroupInfo]:
        config = self.suite.actor_config(actor_of(group))
        if config is None:
            return None
        return GroupInfo(
            config.model,
            config.options.get("unique_order_by") or opt.DEFAULT_UNIQUE_ORDER_BY,
            float(config.options.get("unique_ttl") or opt.DEFAULT_UNIQUE_TTL),
        )

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
