"""Redis locks, in milliseconds and our tokens: a key ``redlock:<name>`` holding its holder's token, as
pottery writes it (so the two exclude each other).  One master: one script per operation; several:
the Redlock algorithm over the same scripts, each master asked over a bounded client of the suite's
own and skipped a while after it failed, so that a master down or stalled costs a lock operation
``lock_timeout`` at most (why: docs/discussions/how-it-is-built.md, "Gates: locks, slots and parking").
Whoever knows a token may release or extend its lock (a queue lock's token travels with its message).
"""

from __future__ import annotations

import dataclasses
import threading
import time
import uuid
from typing import Any, Callable, Optional, Sequence

import redis
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry

from dramatiq_unique.errors import RedisUnavailable, redis_errors
from dramatiq_unique.redis import lua, scripts
from dramatiq_unique.redis.keys import LOCK_PREFIX
from dramatiq_unique.redis.lua import KEPT, NOT_HELD, RELEASED
from dramatiq_unique.redis.servers import address, connection_settings

#: ms each Redlock master may take to connect or to answer (the ``lock_timeout`` setting).
DEFAULT_LOCK_TIMEOUT = 100
#: ms a master that failed is skipped before it is asked again.
PAUSE = 1_000
#: pottery's (and the Redlock paper's) allowance for clock drift: 1% of the TTL, plus 2 ms.
CLOCK_DRIFT_FACTOR = 0.01


class MasterSkipped(RedisConnectionError):
    """A master that failed a moment ago is not asked again yet."""


class _Forcing(threading.local):
    on = False


#: Set while this thread asks masters it would skip (their answers are needed for a majority).
_forcing = _Forcing()


class Master:
    """One Redlock master, asked over a bounded client of its own (:func:`bounded_client`), and skipped
    for :data:`PAUSE` ms after it failed, by this object and by its connections alike."""

    def __init__(self, client: redis.Redis, timeout_ms: float) -> None:
        self.where = address(client)
        #: time.monotonic() until which the master is skipped.
        self.down_until = 0.0
        #: Whether its last failure was a timeout (a stalled master), not a refused connection.
        self.timed_out = False
        #: Whether a thread is asking it again while it is skipped (one at a time).
        self.probing = False
        self._lock = threading.Lock()
        self.client = bounded_client(client, timeout_ms, self)
        self.scripts = {name: lua.register(self.client, name) for name in SCRIPTS}

    def skipped(self) -> bool:
        """Whether the master failed within the last :data:`PAUSE` ms.  Once the pause is over, one
        thread asks it again while the others keep skipping it until that one knows."""
        if not self.down_until:
            return False
        now = time.monotonic()
        if self.down_until > now:
            return True
        with self._lock:
            if self.down_until > now:
                return True
            self.down_until = now + PAUSE / 1000  # this thread probes; should it fail, the pause goes on
            return False

    def probe(self) -> bool:
        """Claim the one probe of a stalled master allowed at a time (see :func:`ask_all`)."""
        with self._lock:
            if self.probing:
                return False
            self.probing = True
            return True

    def failed(self, error: Exception) -> None:
        self.timed_out = isinstance(error, RedisTimeoutError)
        self.down_until = time.monotonic() + PAUSE / 1000

    def answered(self) -> None:
        if self.down_until:
            self.down_until = 0.0

    def call(self, fn: Callable[["Master"], Any]) -> Any:
        """``fn(self)``; a connection error or a timeout has the master skipped for a while (even a refused
        connection: under load each failed call costs its thread a turn at the GIL per system call)."""
        try:
            reply = fn(self)
        except MasterSkipped:
            raise
        except (RedisConnectionError, RedisTimeoutError) as e:
            self.failed(e)
            raise
        self.answered()
        return reply


def _guarded(connection_class: type, master: Master) -> type:
    """``connection_class``, its connections failing at once while ``master`` is skipped, and telling it
    of their failures: a master down costs the suite's plain commands (wake-up flags, on the first
    master) no system call while it is skipped."""

    class Guarded(connection_class):
        def connect_check_health(self, *args: Any, **kwargs: Any) -> Any:
            if self._sock is None and not _forcing.on and master.skipped():
                raise MasterSkipped(f"master {master.where} failed a moment ago")
            try:
                return super().connect_check_health(*args, **kwargs)
            except (RedisConnectionError, RedisTimeoutError) as e:
                master.failed(e)
                raise

        def read_response(self, *args: Any, **kwargs: Any) -> Any:
            try:
                reply = super().read_response(*args, **kwargs)
            except (RedisConnectionError, RedisTimeoutError) as e:
                master.failed(e)
                raise
            master.answered()
            return reply

    Guarded.__name__ = Guarded.__qualname__ = f"Guarded{connection_class.__name__}"
    return Guarded


def bounded_client(client: redis.Redis, timeout_ms: float, master: Master) -> redis.Redis:
    """A client of the same server as ``client``, with socket timeouts of ``timeout_ms``, no retry after a
    timeout and one after a broken connection, skipped while ``master`` is.  A pool that cannot be
    copied (Sentinel...) is used as it is."""
    pool = client.connection_pool
    seconds = timeout_ms / 1000
    kwargs = connection_settings(pool)
    # Sent again once after a connection error (a connection the server closed when it restarted:
    # our plain commands are safe to repeat), never after a timeout (a stalled server).
    kwargs.update(socket_timeout=seconds, socket_connect_timeout=seconds, retry_on_error=[], retry_on_timeout=False,
                  retry=Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,)))
    try:
        pool.connection_class(**kwargs)  # the settings fit the connection class (nothing connects yet)
        cls = _guarded(pool.connection_class, master)
        return redis.Redis(connection_pool=redis.ConnectionPool(connection_class=cls, **kwargs))
    except Exception:  # pragma: no cover  (a pool that takes other settings)
        return client


def drift(ttl_ms: float) -> float:
    return ttl_ms * CLOCK_DRIFT_FACTOR + 2


@dataclasses.dataclass
class Replies:
    """What the masters answered to one operation: their replies, and the errors of those that failed."""

    replies: list[Any] = dataclasses.field(default_factory=list)
    errors: list[Exception] = dataclasses.field(default_factory=list)

    def count(self, predicate: Callable[[Any], bool]) -> int:
        return sum(1 for reply in self.replies if predicate(reply))


def ask_all(masters: Sequence[Master], fn: Callable[[Master], Any], quorum: int, force: bool = True) -> Replies:
    """``fn(master)`` on every master in turn.  One that failed a moment ago is skipped, counted as failed,
    unless the others cannot reach ``quorum`` without it and ``force``: then it is asked too (one that
    timed out by one thread at a time, the others counting it as failed)."""
    out = Replies()
    skipped = []
    _forcing.on = True  # the skipping is done here: the connections' own check would skip a probe
    try:
        for master in masters:
            if master.skipped():
                skipped.append(master)
                continue
            try:
                out.replies.append(master.call(fn))
            except redis.RedisError as e:
                out.errors.append(e)
        if not (force and len(out.errors) + len(skipped) > len(masters) - quorum):
            skipped, left_out = [], skipped
        else:  # a master that timed out fails slowly: one thread at a time asks it (it may have resumed)
            left_out = [m for m in skipped if m.timed_out and not m.probe()]
            skipped = [m for m in skipped if m not in left_out]
        for master in skipped:
            try:
                out.replies.append(master.call(fn))
            except redis.RedisError as e:
                out.errors.append(e)
            finally:
                master.probing = False
        out.errors += [MasterSkipped(f"master {m.where} failed a moment ago") for m in left_out]
    finally:
        _forcing.on = False
    return out


#: The scripts (``redis/lua/<name>.lua``) of the lock operations.
SCRIPTS = ("lock_acquire", "lock_release", "lock_extend", "lock_pttl", "lock_release_unless", "lock_force",
           "lock_transfer")


def new_token() -> str:
    return str(uuid.uuid4())


class Locks:
    """Locks over one or several Redis masters.

    Parameters:
      masters: the Redis clients; with more than one, a lock needs a majority of them (Redlock), each asked
        over a bounded client of the suite's own.
      timeout_ms: with several masters, how long each may take to connect or answer (the ``lock_timeout``
        setting).  One master is asked over the client given.
    """

    def __init__(self, masters: Sequence[redis.Redis], *, timeout_ms: float = DEFAULT_LOCK_TIMEOUT) -> None:
        self.masters = list(masters)
        self.single = len(self.masters) == 1
        self.quorum = len(self.masters) // 2 + 1
        self._scripts = {name: lua.register(self.masters[0], name) for name in SCRIPTS} if self.single else {}
        #: With several masters, each master's bounded client and state.
        self.nodes = [] if self.single else [Master(client, timeout_ms) for client in self.masters]
        #: The clients the locks are asked over: the one master's as given; of several, each one's bounded client.
        self.clients = self.masters if self.single else [node.client for node in self.nodes]

    def _one(self, script: str, doing: str, name: str, args: list, *keys: str) -> Any:
        try:
            return self._scripts[script](keys=[f"{LOCK_PREFIX}:{name}", *keys], args=args)
        except redis.RedisError as e:
            raise RedisUnavailable(f"{doing} lock {name!r}: {e}") from e

    def _each(self, script: str, name: str, args: list, force: bool = True) -> Replies:
        """Several masters: the script on each; ``force=False`` for a clean-up, which skips a master
        that failed a moment ago even if the others make no majority (it decides nothing)."""
        keys = [f"{LOCK_PREFIX}:{name}"]
        return ask_all(self.nodes, lambda master: master.scripts[script](keys=keys, args=args), self.quorum, force)

    def _check(self, replies: Replies, doing: str, name: str) -> None:
        """Raise if too many masters failed for a majority to be reached (pottery's QuorumIsImpossible)."""
        if len(replies.errors) > len(self.nodes) - self.quorum:
            error = replies.errors[0]
            raise RedisUnavailable(
                f"{doing} lock {name!r}: {len(replies.errors)} of {len(self.nodes)} Redis masters failed "
                f"(a majority must answer): {error}"
            ) from error

    def _yes(self, script: str, doing: str, name: str, args: list, lost: tuple = ()) -> bool:
        """Whether the script said yes: on the one master, or on a majority.  Without a majority, what is
        left of the lock under the tokens ``lost`` is freed (a minority's hold would otherwise stand in the
        next holder's way until it expires)."""
        if self.single:
            return bool(self._one(script, doing, name, args))
        replies = self._each(script, name, args)
        if replies.count(bool) >= self.quorum:
            return True
        for token in lost:
            self._each("lock_release", name, [token], force=False)
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

    def force(self, locks: Sequence[tuple[str, str, float]]) -> None:
        """Take each lock ``(name, token, ttl ms)`` whoever holds it (the caller knows the holder is stale), in
        one round trip; on one master only: of several, a stale lock cannot be overwritten safely."""
        calls = [([f"{LOCK_PREFIX}:{name}"], [token, int(ttl_ms)]) for name, token, ttl_ms in locks]
        with redis_errors(f"taking lock {locks[0][0]!r}" if len(locks) == 1 else f"taking {len(locks)} locks"):
            scripts.run_all(self._scripts["lock_force"], calls, multi=False)

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
        """Re-issue ``name`` under ``new_token`` with a fresh lease if ``token`` holds it: a lock handed to another job
        gets a token of its own, so a stale copy of an earlier holder's message never passes for the holder."""
        return self._yes("lock_transfer", "handing over", name, [token, new_token, int(ttl_ms)], (new_token, token))

    def pttl(self, name: str) -> float:
        """Milliseconds until ``name`` frees itself, whoever holds it; 0 if it is free."""
        key = f"{LOCK_PREFIX}:{name}"
        if self.single:
            with redis_errors(f"reading lock {name!r}"):
                return float(max(int(self.masters[0].pttl(key)), 0))
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
