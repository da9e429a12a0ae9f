"""The Redlock masters: each one bounded, so that a master down or stalled costs little.

The Redlock algorithm asks each master with a timeout small next to the
lock's TTL, and never waits for a master that does not answer: a majority
decides.  The clients the user passes carry their own settings, made for
other work (redis-py 8 gives a client built with ``redis.Redis(...)`` 5 s
socket timeouts and ten retries with back-off), under which one master
down made every lock operation wait seconds.  So the suite asks each master
over a client of its own, made from the user's with the same connection
settings (address, database, password, TLS) but with socket timeouts of
``lock_timeout``, no retry after a timeout and one at once after a broken
connection (a restarted server): a master that refuses costs a refused
connection; one that is stalled (SIGSTOP, a network partition) costs
``lock_timeout`` at most.

A master that failed is then skipped, as if it had failed again, for
:data:`PAUSE` ms before one thread asks it again: a stalled master costs
one timeout per pause, not one per lock operation, and a dead one a
refused connection per pause (under load, even that costs its thread a
turn at the GIL per system call).  The skip guards the bounded client's
own connections too, so the suite's plain commands on the first master
(wake-up flags, slots) skip it as well.  Skipping a master never weakens
a lock: the quorum is counted over all of them, and a skipped master is
asked anyway (it may be back) when the others cannot make a majority (a
stalled one by one thread at a time).
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Optional, Sequence

import redis
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry

from dramatiq_unique.redis import scripts
from dramatiq_unique.redis.servers import describe

#: ms each Redlock master may take to connect or to answer (the ``lock_timeout`` setting).
DEFAULT_LOCK_TIMEOUT = 100
#: ms a master that failed is skipped before it is asked again.
PAUSE = 1_000
#: pottery's (and the Redlock paper's) allowance for clock drift: 1% of the TTL, plus 2 ms.
CLOCK_DRIFT_FACTOR = 0.01

# Connection settings that belong to the user's pool itself (redis-py 7+'s maintenance
# notifications) or that redis-py derives again: not copied to the derived pool.
_POOL_OWN = ("maint_notifications_pool_handler", "maint_notifications_config", "himport_registry",
             "orig_host_address", "orig_socket_timeout", "orig_socket_connect_timeout")


class MasterSkipped(RedisConnectionError):
    """A master that failed a moment ago is not asked again yet."""


class Health:
    """Whether a master failed a moment ago, shared by its :class:`Master` and its connections."""

    def __init__(self, where: str) -> None:
        self.where = where
        #: time.monotonic() until which the master is skipped.
        self.down_until = 0.0
        #: Whether its last failure was a timeout (a stalled master), not a refused connection.
        self.timed_out = False
        #: Whether a thread is asking it again while it is skipped (one at a time).
        self.probing = False
        self._lock = threading.Lock()

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


class _Forcing(threading.local):
    on = False


#: Set while this thread asks masters it would skip (their answers are needed for a majority).
_forcing = _Forcing()


def _guarded(connection_class: type, health: Health) -> type:
    """``connection_class``, its connections failing at once while ``health`` says skip, and
    telling ``health`` of their failures: a master down costs the suite's plain commands (wake-up
    flags, on the first master) no system call while it is skipped."""

    class Guarded(connection_class):
        def connect_check_health(self, *args: Any, **kwargs: Any) -> Any:
            if self._sock is None and not _forcing.on and health.skipped():
                raise MasterSkipped(f"master {health.where} failed a moment ago")
            try:
                return super().connect_check_health(*args, **kwargs)
            except (RedisConnectionError, RedisTimeoutError) as e:
                health.failed(e)
                raise

        def read_response(self, *args: Any, **kwargs: Any) -> Any:
            try:
                reply = super().read_response(*args, **kwargs)
            except (RedisConnectionError, RedisTimeoutError) as e:
                health.failed(e)
                raise
            health.answered()
            return reply

    Guarded.__name__ = Guarded.__qualname__ = f"Guarded{connection_class.__name__}"
    return Guarded


def bounded_client(client: redis.Redis, timeout_ms: float, health: Optional[Health] = None) -> redis.Redis:
    """A client of the same server as ``client``, with socket timeouts of ``timeout_ms``, no retry
    after a timeout and one after a broken connection; with ``health``, skipped while it says so.

    A pool of an unusual kind (Sentinel...) that cannot be copied is used as it is.
    """
    pool = client.connection_pool
    seconds = timeout_ms / 1000
    kwargs = {key: value for key, value in pool.connection_kwargs.items() if key not in _POOL_OWN}
    # Sent again once after a connection error (a connection the server closed when it restarted:
    # our plain commands are safe to repeat), never after a timeout (a stalled server).
    kwargs.update(socket_timeout=seconds, socket_connect_timeout=seconds, retry_on_error=[], retry_on_timeout=False,
                  retry=Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,)))
    try:
        pool.connection_class(**kwargs)  # the settings fit the connection class (nothing connects yet)
        cls = pool.connection_class if health is None else _guarded(pool.connection_class, health)
        return redis.Redis(connection_pool=redis.ConnectionPool(connection_class=cls, **kwargs))
    except Exception:  # pragma: no cover  (a pool that takes other settings)
        return client


def drift(ttl_ms: float) -> float:
    """The clock-drift allowance of a lease of ``ttl_ms``."""
    return ttl_ms * CLOCK_DRIFT_FACTOR + 2


class Master:
    """One Redlock master, asked over a bounded client (:func:`bounded_client`), skipped a while after it failed."""

    def __init__(self, client: redis.Redis, timeout_ms: float) -> None:
        self.user_client = client
        self.health = Health(_where(client))
        self.client = bounded_client(client, timeout_ms, self.health)
        self._scripts: dict[str, scripts.Script] = {}
        self._lock = threading.Lock()

    @property
    def timed_out(self) -> bool:
        return self.health.timed_out

    def run(self, text: str, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        """Run one of our scripts on this master (registered on first use)."""
        script = self._scripts.get(text)
        if script is None:
            with self._lock:
                script = self._scripts.setdefault(text, scripts.Script(self.client, text))
        return script(keys=keys, args=args)

    def skipped(self) -> bool:
        return self.health.skipped()

    def call(self, fn: Callable[["Master"], Any]) -> Any:
        """``fn(self)``; a connection error or a timeout has the master skipped for a while.

        Even a refused connection is worth skipping: under load each failed call costs its
        thread a turn at the GIL per system call, several times the call itself.
        """
        try:
            reply = fn(self)
        except MasterSkipped:
            raise
        except (RedisConnectionError, RedisTimeoutError) as e:
            self.health.failed(e)
            raise
        self.health.answered()
        return reply


def _where(client: redis.Redis) -> str:
    sentinel = describe(client)
    if sentinel is not None:
        return sentinel
    kwargs = client.connection_pool.connection_kwargs
    return kwargs.get("path") or f"{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}"


class Replies:
    """What the masters answered to one operation: their replies, and the errors of those that failed."""

    def __init__(self) -> None:
        self.replies: list[Any] = []
        self.errors: list[Exception] = []

    def count(self, predicate: Callable[[Any], bool]) -> int:
        return sum(1 for reply in self.replies if predicate(reply))


def ask_all(masters: Sequence[Master], fn: Callable[[Master], Any], quorum: int, force: bool = True) -> Replies:
    """``fn(master)`` on every master in turn; each costs at most its bounded client's timeout.

    A master that failed a moment ago is skipped, counted as failed,
    unless the others cannot reach ``quorum`` without it and ``force``:
    then it is asked too (it may be back); one that timed out (slow to
    fail) by one thread at a time, the others counting it as failed.
    """
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
            left_out = [m for m in skipped if m.timed_out and not m.health.probe()]
            skipped = [m for m in skipped if m not in left_out]
        for master in skipped:
            try:
                out.replies.append(master.call(fn))
            except redis.RedisError as e:
                out.errors.append(e)
            finally:
                master.health.probing = False
        out.errors += [MasterSkipped(f"master {m.health.where} failed a moment ago") for m in left_out]
    finally:
        _forcing.on = False
    return out
