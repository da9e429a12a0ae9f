"""Redis locks: the only module that touches pottery.

Everything here is in our units (milliseconds) and our tokens.  A lock
is a Redis key ``redlock:<name>`` holding its holder's token with a
TTL, as pottery's :class:`~pottery.Redlock` writes it:

* with several masters, pottery's Redlock does the quorum work;
* with one master, the same commands are issued directly: pottery runs
  every call through a thread pool, which costs about four plain
  round trips, and there is no quorum to gather.

A token passes between processes (the enqueuing process takes a queue
lock, a worker releases it): whoever knows the token may release or
extend the lock, which is what :meth:`Locks.release` takes.
"""

from __future__ import annotations

import json
import uuid
from typing import Optional, Sequence

import redis

from . import scripts
from .errors import RedisUnavailable

# pottery replaces json.dumps on import; put the original back so that
# nothing else in the process (Dramatiq's encoder included) changes.
_json_dumps = json.dumps
import pottery  # noqa: E402
from pottery.exceptions import PotteryError, PrimitiveError  # noqa: E402

json.dumps = _json_dumps

# pottery's quorum errors (QuorumIsImpossible, QuorumNotAchieved) are PrimitiveErrors, not PotteryErrors.
_ERRORS = (redis.RedisError, PotteryError, PrimitiveError)

#: The prefix pottery gives lock keys.
KEY_PREFIX = "redlock"
#: pottery stops extending after this many extensions unless raised; ours never stop.
_UNLIMITED_EXTENSIONS = 2**62

# KEYS[1] lock; ARGV token, ttl.  Take the lock (the integer 1), or answer the holder's
# token (a string; nil if the lock expired meanwhile).  Flat replies: this is on every send.
_ACQUIRE = """
if redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 1 end
return redis.call('get', KEYS[1])
"""
# The release and extend scripts mirror pottery's: act only for the holder.
_RELEASE = """
if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end
return 0
"""
_EXTEND = """
if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) end
return 0
"""
_PTTL = """
if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pttl', KEYS[1]) end
return -3
"""
# KEYS[1] lock; ARGV token, ttl.  Take the lock whoever holds it.
_FORCE = """
return redis.call('set', KEYS[1], ARGV[1], 'PX', ARGV[2]) and 1
"""
# KEYS[1] lock; ARGV token, new token, ttl.  Re-issue a held lock under a new token.
_TRANSFER = """
if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('set', KEYS[1], ARGV[2], 'PX', ARGV[3]) and 1 end
return 0
"""
# KEYS[1] lock, KEYS[2] a sorted set; ARGV token, member.  Release unless
# the member is in the set (someone may be waiting): 1 released, 2 kept, 0 not held.
_RELEASE_UNLESS = """
if redis.call('get', KEYS[1]) ~= ARGV[1] then return 0 end
if redis.call('zscore', KEYS[2], ARGV[2]) then return 2 end
redis.call('del', KEYS[1])
return 1
"""

#: Outcomes of :meth:`Locks.release_unless`.
NOT_HELD, RELEASED, KEPT = 0, 1, 2


def new_token() -> str:
    return str(uuid.uuid4())


class Locks:
    """Locks over one or several Redis masters.

    Parameters:
      masters: the Redis clients; with more than one, a lock needs a
        majority of them (Redlock).
    """

    def __init__(self, masters: Sequence[redis.Redis]) -> None:
        if not masters:
            raise ValueError("at least one Redis master is needed")
        self.masters = list(masters)
        self.single = len(self.masters) == 1
        if self.single:
            client = self.masters[0]
            self._acquire = scripts.register(client, _ACQUIRE)
            self._release = scripts.register(client, _RELEASE)
            self._extend = scripts.register(client, _EXTEND)
            self._pttl = scripts.register(client, _PTTL)
            self._release_unless = scripts.register(client, _RELEASE_UNLESS)
            self._force = scripts.register(client, _FORCE)
        # Transfers run the same script on every master (pottery has no such operation).
        self._transfer = [scripts.register(client, _TRANSFER) for client in self.masters]
        self.quorum = len(self.masters) // 2 + 1

    def _redlock(self, name: str, ttl_ms: float = 10_000, token: str = "") -> "pottery.Redlock":
        lock = pottery.Redlock(
            key=name,
            masters=set(self.masters),
            raise_on_redis_errors=True,
            auto_release_time=ttl_ms / 1000,
            num_extensions=_UNLIMITED_EXTENSIONS,
        )
        lock._uuid = token  # pottery keeps the holder's token private
        return lock

    def acquire(self, name: str, ttl_ms: float, token: Optional[str] = None) -> tuple[Optional[str], Optional[str]]:
        """Try once to take ``name``.

        Returns ``(token, None)`` when taken, ``(None, holder)`` when
        someone holds it; ``holder`` is their token where it can be known
        (one master), else None.  Raises :class:`RedisUnavailable`.
        """
        try:
            if self.single:
                token = token or new_token()
                reply = self._acquire(keys=[f"{KEY_PREFIX}:{name}"], args=[token, int(ttl_ms)])
                if reply == 1:  # a holder token is bytes, never equal to 1
                    return token, None
                return None, (reply.decode() if isinstance(reply, bytes) else reply)
            lock = self._redlock(name, ttl_ms)
            if lock.acquire(blocking=False):
                return lock._uuid, None
            return None, None
        except _ERRORS as e:
            raise RedisUnavailable(f"taking lock {name!r}: {e}") from e

    def force(self, name: str, token: str, ttl_ms: float) -> Optional[str]:
        """Take ``name`` for ``token`` whoever holds it (the caller knows the holder is stale).

        With several masters a stale lock cannot be overwritten safely; it
        is left to expire and None is returned.
        """
        if not self.single:
            return None
        try:
            self._force(keys=[f"{KEY_PREFIX}:{name}"], args=[token, int(ttl_ms)])
            return token
        except redis.RedisError as e:
            raise RedisUnavailable(f"taking lock {name!r}: {e}") from e

    def release(self, name: str, token: str) -> bool:
        """Release ``name`` if ``token`` holds it; False if it did not."""
        try:
            if self.single:
                return bool(self._release(keys=[f"{KEY_PREFIX}:{name}"], args=[token]))
            self._redlock(name, token=token).release()
            return True
        except pottery.ReleaseUnlockedLock:
            return False
        except _ERRORS as e:
            raise RedisUnavailable(f"releasing lock {name!r}: {e}") from e

    def release_later(self, name: str, token: str) -> None:
        """Release ``name`` if ``token`` holds it, without waiting for Redis's reply (one master;
        with several, as :meth:`release`).  This thread's later Redis calls come after it."""
        if not self.single:
            self.release(name, token)
            return
        try:
            self._release.post(keys=[f"{KEY_PREFIX}:{name}"], args=[token])
        except _ERRORS as e:
            raise RedisUnavailable(f"releasing lock {name!r}: {e}") from e

    def extend(self, name: str, token: str, ttl_ms: float) -> bool:
        """Renew ``name``'s lease to ``ttl_ms`` if ``token`` holds it; False if it does not."""
        try:
            if self.single:
                return bool(self._extend(keys=[f"{KEY_PREFIX}:{name}"], args=[token, int(ttl_ms)]))
            self._redlock(name, ttl_ms, token).extend()
            return True
        except pottery.ExtendUnlockedLock:
            return False
        except _ERRORS as e:
            raise RedisUnavailable(f"extending lock {name!r}: {e}") from e

    def ttl(self, name: str, token: str) -> float:
        """Milliseconds left on ``token``'s hold of ``name``; 0 if it does not hold it."""
        try:
            if self.single:
                left = self._pttl(keys=[f"{KEY_PREFIX}:{name}"], args=[token])
                return float(max(left, 0))
            return self._redlock(name, token=token).locked() * 1000
        except _ERRORS as e:
            raise RedisUnavailable(f"reading lock {name!r}: {e}") from e

    def transfer(self, name: str, token: str, new_token: str, ttl_ms: float) -> bool:
        """Re-issue ``name`` under ``new_token`` with a fresh lease if ``token`` holds it.

        A lock handed to another job gets a token of its own, so a stale
        copy of an earlier holder's message can never pass for the holder.
        """
        done = failed = 0
        error: Optional[Exception] = None
        for script in self._transfer:
            try:
                done += bool(script(keys=[f"{KEY_PREFIX}:{name}"], args=[token, new_token, int(ttl_ms)]))
            except redis.RedisError as e:
                failed, error = failed + 1, e
        if done >= self.quorum:
            return True
        if failed > len(self.masters) - self.quorum:
            raise RedisUnavailable(f"handing over lock {name!r}: {error}") from error
        return False

    def pttl(self, name: str) -> float:
        """Milliseconds until ``name`` frees itself, whoever holds it; 0 if it is free."""
        left = []
        error: Optional[Exception] = None
        for client in self.masters:
            try:
                left.append(max(int(client.pttl(f"{KEY_PREFIX}:{name}")), 0))
            except redis.RedisError as e:
                error = e
        if len(left) < self.quorum:
            raise RedisUnavailable(f"reading lock {name!r}: {error}") from error
        # Held while a majority still has it: the quorum-th longest lease.
        return float(sorted(left, reverse=True)[self.quorum - 1])

    def release_unless(self, name: str, token: str, flags: str, member: str) -> int:
        """Release ``name`` unless ``member`` is in the sorted set ``flags``.

        Returns :data:`RELEASED`, :data:`KEPT` (the member is flagged; the
        caller still holds the lock) or :data:`NOT_HELD`.  Atomic on one
        master; with several, the flag (on the first master) is read
        first, so the caller must look at it again after a release.
        """
        if self.single:
            try:
                return int(self._release_unless(keys=[f"{KEY_PREFIX}:{name}", flags], args=[token, member]))
            except redis.RedisError as e:
                raise RedisUnavailable(f"releasing lock {name!r}: {e}") from e
        try:
            flagged = self.masters[0].zscore(flags, member) is not None
        except redis.RedisError:
            flagged = True  # cannot tell: assume someone waits, the caller asks the database
        if flagged:
            return KEPT if self.ttl(name, token) > 0 else NOT_HELD
        return RELEASED if self.release(name, token) else NOT_HELD

