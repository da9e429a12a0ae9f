"""Redis locks, in milliseconds and our tokens: a key ``redlock:<name>`` holding its holder's token, as
pottery writes it (so the two exclude each other).  One master: one script per operation; several:
the Redlock algorithm over the same scripts (:mod:`dramatiq_unique.locks.masters`).  Whoever knows
a token may release or extend its lock (a queue lock's token travels with its message).
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Optional, Sequence

import redis

from dramatiq_unique.errors import RedisUnavailable
from dramatiq_unique.locks.masters import DEFAULT_LOCK_TIMEOUT, Master, MasterSkipped, Replies, ask_all, drift
from dramatiq_unique.redis import lua
from dramatiq_unique.redis.keys import LOCK_PREFIX

#: Outcomes of :meth:`Locks.release_unless`: the replies of its script.
NOT_HELD, RELEASED, KEPT = lua.NOT_HELD, lua.RELEASED, lua.KEPT


#: The scripts (``redis/lua/<name>.lua``) of the lock operations.
SCRIPTS = ("lock_acquire", "lock_release", "lock_extend", "lock_pttl", "lock_release_unless", "lock_force",
           "lock_transfer")


def new_token() -> str:
    return str(uuid.uuid4())


class Locks:
    """Locks over one or several Redis masters.

    Parameters:
      masters: the Redis clients; with more than one, a lock needs a majority of them (Redlock),
        each asked over a bounded client of the suite's own.
      timeout_ms: with several masters, how long each may take to connect or answer (the
        ``lock_timeout`` setting).  One master is asked over the client given.
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
        self._scripts: dict[str, Any] = {}
        if self.single:
            self._scripts = {name: lua.register(self.masters[0], name) for name in SCRIPTS}
        else:
            self.nodes = [Master(client, timeout_ms) for client in self.masters]

    def _one(self, script: str, doing: str, name: str, args: list, *keys: str) -> Any:
        """One master: ``redis/lua/<script>.lua`` on it."""
        try:
            return self._scripts[script](keys=[f"{LOCK_PREFIX}:{name}", *keys], args=args)
        except redis.RedisError as e:
            raise RedisUnavailable(f"{doing} lock {name!r}: {e}") from e

    def _each(self, script: str, name: str, args: list, force: bool = True) -> Replies:
        """Several masters: the script on each; ``force=False`` for a clean-up, which skips a master
        that failed a moment ago even if the others make no majority (it decides nothing)."""
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

    def _yes(self, script: str, doing: str, name: str, args: list) -> bool:
        """Whether the script said yes: on the one master, or on a majority."""
        if self.single:
            return bool(self._one(script, doing, name, args))
        replies = self._each(script, name, args)
        if replies.count(bool) >= self.quorum:
            return True
        self._check(replies, doing, name)
        return False

    # -- the operations ---------------------------------------------------------------

    def acquire(self, name: str, ttl_ms: float, token: Optional[str] = None) -> tuple[Optional[str], Optional[str]]:
        """Try once to take ``name`` for ``token`` (a new one if not given): ``(token, None)`` when
        taken, ``(None, holder)`` when held, ``holder`` their token where it can be known (one master;
        several, where a majority agrees), else None.  Raises :class:`RedisUnavailable`."""
        token = token or new_token()
        if self.single:
            reply = self._one("lock_acquire", "taking", name, [token, int(ttl_ms)])
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
        """Take ``name`` for ``token`` whoever holds it (the caller knows the holder is stale); with several
        masters a stale lock cannot be overwritten safely: it is left to expire, and None returned."""
        if not self.single:
            return None
        self._one("lock_force", "taking", name, [token, int(ttl_ms)])
        return token

    def release(self, name: str, token: str) -> bool:
        """Release ``name`` if ``token`` holds it; False if it did not."""
        return self._yes("lock_release", "releasing", name, [token])

    def release_later(self, name: str, token: str) -> None:
        """Release ``name`` if ``token`` holds it, without waiting for Redis's reply (one master;
        with several, as :meth:`release`).  This thread's later Redis calls come after it."""
        if not self.single:
            self.release(name, token)
            return
        try:
            self._scripts["lock_release"].post(keys=[f"{LOCK_PREFIX}:{name}"], args=[token])
        except redis.RedisError as e:
            raise RedisUnavailable(f"releasing lock {name!r}: {e}") from e

    def extend(self, name: str, token: str, ttl_ms: float) -> bool:
        """Renew ``name``'s lease to ``ttl_ms`` if ``token`` holds it; False if it does not."""
        return self._yes("lock_extend", "extending", name, [token, int(ttl_ms)])

    def ttl(self, name: str, token: str) -> float:
        """Milliseconds left on ``token``'s hold of ``name``; 0 if it does not hold it."""
        if self.single:
            return float(max(self._one("lock_pttl", "reading", name, [token]), 0))
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
        """Re-issue ``name`` under ``new_token`` with a fresh lease if ``token`` holds it: a lock handed
        to another job gets a token of its own, so a stale copy of an earlier holder's message never
        passes for the holder."""
        args = [token, new_token, int(ttl_ms)]
        if self.single:
            return bool(self._one("lock_transfer", "handing over", name, args))
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
        """Release ``name`` unless ``member`` is in the sorted set ``flags``: RELEASED, KEPT (still held) or
        NOT_HELD.  Atomic on one master; with several, the flag (on the first) is read first, so the
        caller must look at it again after a release."""
        if self.single:
            return int(self._one("lock_release_unless", "releasing", name, [token, member], flags))
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
