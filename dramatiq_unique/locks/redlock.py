"""Redis locks, in our units (milliseconds) and our tokens.

A lock is a Redis key ``redlock:<name>`` holding its holder's token with a
TTL, as pottery's :class:`~pottery.Redlock` writes it (so a pottery Redlock
and ours exclude each other):

* with one master, one script per operation, over the client given;
* with several, the Redlock algorithm as pottery runs it (a majority of
  the masters, a lease shortened by the time taken and the clock drift),
  over the same scripts, with each master asked over a bounded client of
  the suite's own (:mod:`dramatiq_unique.locks.masters`): a master down or
  stalled costs an operation ``lock_timeout`` at most.  pottery's own
  Redlock cannot serve here: its acquire draws a random token of its own
  (a queue lock's token is its message id), and it asks the masters over
  the user's clients, with their retries and back-off.

A token passes between processes (the enqueuing process takes a queue
lock, a worker releases it): whoever knows the token may release or
extend the lock, which is what :meth:`Locks.release` takes.

Every script (``redis/lua/lock_*.lua``) is safe to send again after a lost
reply (see :mod:`dramatiq_unique.redis.scripts`): each recognises its
caller's token.
"""

from __future__ import annotations

import time
import uuid
from typing import Optional, Sequence

import redis

from dramatiq_unique.errors import RedisUnavailable
from dramatiq_unique.locks.masters import DEFAULT_LOCK_TIMEOUT, Master, MasterSkipped, Replies, ask_all, drift
from dramatiq_unique.redis import lua
from dramatiq_unique.redis.keys import LOCK_PREFIX

#: Outcomes of :meth:`Locks.release_unless`: the replies of its script.
NOT_HELD, RELEASED, KEPT = lua.NOT_HELD, lua.RELEASED, lua.KEPT


def new_token() -> str:
    return str(uuid.uuid4())


class Locks:
    """Locks over one or several Redis masters.

    Parameters:
      masters: the Redis clients; with more than one, a lock needs a
        majority of them (Redlock), each asked over a bounded client of
        the suite's own.
      timeout_ms: with several masters, how long each may take to connect
        or answer (the ``lock_timeout`` setting).  One master is asked over
        the client given, with its own timeouts.
    """

    def __init__(self, masters: Sequence[redis.Redis], *, timeout_ms: float = DEFAULT_LOCK_TIMEOUT) -> None:
        if not masters:
            raise ValueError("at least one Redis master is needed")
        self.masters = list(masters)
        self.single = len(self.masters) == 1
        self.quorum = len(self.masters) // 2 + 1
        self.timeout_ms = timeout_ms
        #: With several masters, each master's bounded client and state (masters.py).
        self.nodes: list[Master] = []
        if self.single:
            client = self.masters[0]
            self._acquire = lua.register(client, "lock_acquire")
            self._release = lua.register(client, "lock_release")
            self._extend = lua.register(client, "lock_extend")
            self._pttl = lua.register(client, "lock_pttl")
            self._release_unless = lua.register(client, "lock_release_unless")
            self._force = lua.register(client, "lock_force")
            self._transfer = lua.register(client, "lock_transfer")
        else:
            self.nodes = [Master(client, timeout_ms) for client in self.masters]

    # -- several masters: run a script on each, count the answers ----------------------

    def _each(self, script: str, name: str, args: list, force: bool = True) -> Replies:
        """The script ``script`` (``redis/lua/<script>.lua``) on every master; ``force=False`` for a
        clean-up, which skips a master that failed a moment ago even if the others make no majority
        (it decides nothing)."""
        keys, text = [f"{LOCK_PREFIX}:{name}"], lua.source(script)
        return ask_all(self.nodes, lambda master: master.run(text, keys, args), self.quorum, force)

    def _check(self, replies: Replies, doing: str, name: str) -> None:
        """Raise if too many masters failed for a majority to be reached (pottery's QuorumIsImpossible)."""
        if len(replies.errors) > len(self.nodes) - self.quorum:
            error = replies.errors[0]
            raise RedisUnavailable(
                f"{doing} lock {name!r}: {len(replies.errors)} of {len(self.nodes)} Redis masters failed "
                f"(a majority must answer): {error}"
            ) from error

    # -- the operations ---------------------------------------------------------------

    def acquire(self, name: str, ttl_ms: float, token: Optional[str] = None) -> tuple[Optional[str], Optional[str]]:
        """Try once to take ``name`` for ``token`` (a new one if not given).

        Returns ``(token, None)`` when taken, ``(None, holder)`` when
        someone holds it; ``holder`` is their token where it can be known
        (one master; several, where a majority agrees), else None.  Raises
        :class:`RedisUnavailable`.
        """
        token = token or new_token()
        key = f"{LOCK_PREFIX}:{name}"
        if self.single:
            try:
                reply = self._acquire(keys=[key], args=[token, int(ttl_ms)])
            except redis.RedisError as e:
                raise RedisUnavailable(f"taking lock {name!r}: {e}") from e
            if reply == 1:  # a holder token is bytes, never equal to 1
                return token, None
            return None, (reply.decode() if isinstance(reply, bytes) else reply)
        started = time.monotonic()
        replies = self._each("lock_acquire", name, [token, int(ttl_ms)])
        # The lease is only as good as what is left of it once a majority said yes.
        validity = ttl_ms - (time.monotonic() - started) * 1000 - drift(ttl_ms)
        if replies.count(lambda r: r == 1) >= self.quorum and validity > 0:
            return token, None
        if replies.count(lambda r: r == 1) or any(not isinstance(e, MasterSkipped) for e in replies.errors):
            # Not taken: free what was taken (on every master asked: one whose reply was lost may hold it).
            self._each("lock_release", name, [token], force=False)
        self._check(replies, "taking", name)
        holders = [r for r in replies.replies if isinstance(r, bytes)]
        holder = max(set(holders), key=holders.count) if holders else None
        return None, (holder.decode() if holder is not None and holders.count(holder) >= self.quorum else None)

    def force(self, name: str, token: str, ttl_ms: float) -> Optional[str]:
        """Take ``name`` for ``token`` whoever holds it (the caller knows the holder is stale).

        With several masters a stale lock cannot be overwritten safely; it
        is left to expire and None is returned.
        """
        if not self.single:
            return None
        try:
            self._force(keys=[f"{LOCK_PREFIX}:{name}"], args=[token, int(ttl_ms)])
            return token
        except redis.RedisError as e:
            raise RedisUnavailable(f"taking lock {name!r}: {e}") from e

    def release(self, name: str, token: str) -> bool:
        """Release ``name`` if ``token`` holds it; False if it did not."""
        if self.single:
            try:
                return bool(self._release(keys=[f"{LOCK_PREFIX}:{name}"], args=[token]))
            except redis.RedisError as e:
                raise RedisUnavailable(f"releasing lock {name!r}: {e}") from e
        replies = self._each("lock_release", name, [token])
        if replies.count(bool) >= self.quorum:
            return True
        self._check(replies, "releasing", name)
        return False

    def release_later(self, name: str, token: str) -> None:
        """Release ``name`` if ``token`` holds it, without waiting for Redis's reply (one master;
        with several, as :meth:`release`).  This thread's later Redis calls come after it."""
        if not self.single:
            self.release(name, token)
            return
        try:
            self._release.post(keys=[f"{LOCK_PREFIX}:{name}"], args=[token])
        except redis.RedisError as e:
            raise RedisUnavailable(f"releasing lock {name!r}: {e}") from e

    def extend(self, name: str, token: str, ttl_ms: float) -> bool:
        """Renew ``name``'s lease to ``ttl_ms`` if ``token`` holds it; False if it does not."""
        if self.single:
            try:
                return bool(self._extend(keys=[f"{LOCK_PREFIX}:{name}"], args=[token, int(ttl_ms)]))
            except redis.RedisError as e:
                raise RedisUnavailable(f"extending lock {name!r}: {e}") from e
        replies = self._each("lock_extend", name, [token, int(ttl_ms)])
        if replies.count(bool) >= self.quorum:
            return True
        self._check(replies, "extending", name)
        return False

    def ttl(self, name: str, token: str) -> float:
        """Milliseconds left on ``token``'s hold of ``name``; 0 if it does not hold it."""
        if self.single:
            try:
                left = self._pttl(keys=[f"{LOCK_PREFIX}:{name}"], args=[token])
            except redis.RedisError as e:
                raise RedisUnavailable(f"reading lock {name!r}: {e}") from e
            return float(max(left, 0))
        started = time.monotonic()
        replies = self._each("lock_pttl", name, [token])
        left = sorted((int(r) for r in replies.replies if int(r) > 0), reverse=True)
        if len(left) >= self.quorum:
            # Held while a majority still has it, less the time taken and the drift.
            quorum_left = left[self.quorum - 1]
            return float(max(quorum_left - (time.monotonic() - started) * 1000 - drift(quorum_left), 0))
        self._check(replies, "reading", name)
        return 0.0

    def transfer(self, name: str, token: str, new_token: str, ttl_ms: float) -> bool:
        """Re-issue ``name`` under ``new_token`` with a fresh lease if ``token`` holds it.

        A lock handed to another job gets a token of its own, so a stale
        copy of an earlier holder's message can never pass for the holder.
        """
        args = [token, new_token, int(ttl_ms)]
        if self.single:
            try:
                return bool(self._transfer(keys=[f"{LOCK_PREFIX}:{name}"], args=args))
            except redis.RedisError as e:
                raise RedisUnavailable(f"handing over lock {name!r}: {e}") from e
        replies = self._each("lock_transfer", name, args)
        if replies.count(bool) >= self.quorum:
            return True
        # Lost: free what is left of it under either token (a minority's hold would otherwise
        # stand in the next holder's way until it expires).
        self._each("lock_release", name, [new_token], force=False)
        self._each("lock_release", name, [token], force=False)
        self._check(replies, "handing over", name)
        return False

    def pttl(self, name: str) -> float:
        """Milliseconds until ``name`` frees itself, whoever holds it; 0 if it is free."""
        key = f"{LOCK_PREFIX}:{name}"
        if self.single:
            try:
                return float(max(int(self.masters[0].pttl(key)), 0))
            except redis.RedisError as e:
                raise RedisUnavailable(f"reading lock {name!r}: {e}") from e
        replies = ask_all(self.nodes, lambda master: master.client.pttl(key), self.quorum)
        self._check(replies, "reading", name)
        # Held while a majority still has it: the quorum-th longest lease.
        left = sorted((max(int(r), 0) for r in replies.replies), reverse=True)
        return float(left[self.quorum - 1])

    def release_unless(self, name: str, token: str, flags: str, member: str) -> int:
        """Release ``name`` unless ``member`` is in the sorted set ``flags``.

        Returns :data:`RELEASED`, :data:`KEPT` (the member is flagged; the
        caller still holds the lock) or :data:`NOT_HELD`.  Atomic on one
        master; with several, the flag (on the first master) is read
        first, so the caller must look at it again after a release.
        """
        if self.single:
            try:
                return int(self._release_unless(keys=[f"{LOCK_PREFIX}:{name}", flags], args=[token, member]))
            except redis.RedisError as e:
                raise RedisUnavailable(f"releasing lock {name!r}: {e}") from e
        first = self.nodes[0]
        try:
            flagged = first.call(lambda master: master.client.zscore(flags, member)) is not None
        except redis.RedisError:
            # Cannot tell: assume someone waits (the caller asks the database), and that the lock
            # is still held: if it is not, handing it on fails (transfer), as asking would have.
            return KEPT
        if flagged:
            if self.ttl(name, token) > 0:
                return KEPT
            # Not held by a majority any more: free what is left of it (a minority's hold would
            # otherwise stand in the next holder's way until it expires).
            self.release(name, token)
            return NOT_HELD
        return RELEASED if self.release(name, token) else NOT_HELD
