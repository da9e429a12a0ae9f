"""Wake-up flags and the watchdog that reads them.

The flags are one Redis sorted set (``RedisKeys.wakeups``) of parking
groups that may have waiters, each scored with when to look at it if
nobody wakes its waiters first: when the holder's lease runs out.  A
flag is only ever a hint that is allowed to be stale in one direction:
present with nobody waiting costs a database look; but a group with
waiters is flagged from the moment its first waiter parked until a
holder of its gate found nobody left (see :mod:`dramatiq_unique.parking.lot`).
Times come from the Redis server's clock, so workers whose clocks
disagree still agree on what is due.
"""

from __future__ import annotations

import logging
import threading
from typing import Callable

import redis

from dramatiq_unique.redis import lua

logger = logging.getLogger(__name__)

class Flags:
    """The wake-up flags in ``key`` on ``client``.  Every call may raise ``redis.RedisError``."""

    def __init__(self, client: redis.Redis, key: str) -> None:
        self.client = client
        self.key = key
        self._flag = lua.register(client, "wakeup_flag")
        self._rescore = lua.register(client, "wakeup_rescore")
        self._due = lua.register(client, "wakeup_due")

    def flag(self, group: str, delay_ms: float) -> None:
        """Flag ``group`` as having waiters, due for a look in ``delay_ms`` (an earlier look is kept)."""
        self._flag(keys=[self.key], args=[group, int(max(delay_ms, 0))])

    def rescore(self, group: str, delay_ms: float) -> None:
        """Look at a flagged group again in ``delay_ms`` (an unflagged one stays unflagged)."""
        self._rescore(keys=[self.key], args=[group, int(max(delay_ms, 0))])

    def clear(self, group: str) -> None:
        self.client.zrem(self.key, group)

    def is_flagged(self, group: str) -> bool:
        return self.client.zscore(self.key, group) is not None

    def due(self, limit: int) -> list[str]:
        """Up to ``limit`` flagged groups whose time came."""
        return [g.decode() if isinstance(g, bytes) else g for g in self._due(keys=[self.key], args=[limit])]


class Watchdog:
    """A daemon thread calling ``tick`` every ``interval_ms()`` (backing off while it fails).

    ``release`` frees the thread's resources (its database connection): at
    exit, and after a failed pass, so a connection that died with its server
    is not kept: the next pass opens a new one (or fails again, and backs off).
    """

    def __init__(self, tick: Callable[[], object], interval_ms: Callable[[], float],
                 release: Callable[[], None]) -> None:
        self._tick, self._interval_ms, self._on_exit = tick, interval_ms, release
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="dramatiq_unique-wakeups", daemon=True)
        self._thread.start()

    def alive(self) -> bool:
        return self._thread.is_alive() and not self._stop.is_set()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def _run(self) -> None:
        failures = 0
        try:
            while not self._stop.wait(self._interval_ms() / 1000 * min(2**failures, 20)):
                try:
                    self._tick()
                    failures = 0
                except Exception:
                    failures += 1
                    logger.warning("Wake-up watchdog pass failed; trying again.", exc_info=failures == 1)
                    try:
                        self._on_exit()
                    except Exception:
                        logger.debug("Could not release the watchdog's connection.", exc_info=True)
        finally:
            self._on_exit()
