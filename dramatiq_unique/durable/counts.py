"""What a re-drive pass did: :class:`RedriveCounts`, which :func:`dramatiq_unique.redrive` returns,
and when it ended (:func:`record_end`, which the ``check`` command reads)."""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import TYPE_CHECKING, Any

import redis

if TYPE_CHECKING:
    from dramatiq_unique.suite import Suite

logger = logging.getLogger(__name__)


def record_end(suite: "Suite") -> None:
    """Record that a pass of the suite's app ended now: one small Redis key per app (a row would cost the
    database a write every pass, and Redis holds the pass lock anyway); a failure is only logged."""
    try:
        suite.redis.set(suite.keys.last_pass(), int(time.time() * 1000))
    except redis.RedisError as e:
        logger.warning("Could not record the end of the re-drive pass: %s", e)


@dataclasses.dataclass
class RedriveCounts:
    """What one pass did."""

    #: False when another process held the pass lock and this call did nothing.
    ran: bool = True
    #: Due pending and retrying jobs sent.
    sent: int = 0
    #: Parked jobs woken because their lock or slot holder was gone.
    woken: int = 0
    #: Jobs whose message was missed for the first time (checked again next pass).
    missing: int = 0
    #: Jobs confirmed lost.
    lost: int = 0
    #: Lost jobs sent again (``on_lost="redrive"``).
    redriven: int = 0
    #: Jobs marked failed: lost with ``on_lost="fail"`` or retries exhausted, or dead-lettered.
    failed: int = 0
    #: Queues whose messages held by dead workers were handed back (Redis broker).
    requeued: int = 0
    #: Retries handed back to their delay queue from a live worker that had dropped them (Redis broker).
    released: int = 0
    #: Finished rows deleted after ``retention``.
    pruned: int = 0
    #: Sends that failed (broker down); those jobs wait for the next pass.
    errors: int = 0
    #: Rows written without an app (an earlier version) that this app took (scope.py).
    adopted: int = 0
    #: Rows found in a combination of columns that no state allows, and set right (repair.py).
    repaired: int = 0
    #: Jobs sent (of ``sent`` and ``redriven``) that were kept pending because the broker was down (deferral.py).
    deferred: int = 0

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    # Read like a dict too: counts["sent"], dict(counts).
    def __getitem__(self, name: str) -> Any:
        if name not in self.__dataclass_fields__:
            raise KeyError(name)
        return getattr(self, name)

    def keys(self) -> list[str]:
        return list(self.__dataclass_fields__)
