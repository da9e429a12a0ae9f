"""Holding a unique key from outside a job: :func:`lock`, a pottery Redlock on the key's execution lock.

While the app holds it, jobs of the key park as behind a running job; while a job runs, it cannot
be taken.  Its release wakes the key's next parked job.  Imported on first use of
``dramatiq_unique.lock``: importing pottery replaces ``json.dumps`` process-wide.
"""

from __future__ import annotations

import inspect
import logging
from types import TracebackType
from typing import Any, Literal, Optional

import dramatiq
from pottery import QuorumIsImpossible, Redlock

from dramatiq_unique import options as opt
from dramatiq_unique.errors import InvalidOption, RedisUnavailable
from dramatiq_unique.parking import lot
from dramatiq_unique.parking.groups import lock_group
from dramatiq_unique.suite import ActorConfig, Suite, current
from dramatiq_unique.unique.keys import canonical, derive_key, digest

logger = logging.getLogger(__name__)


class KeyLock(Redlock):
    """A pottery :class:`~pottery.Redlock` on a unique key's execution lock; :func:`lock` makes one.

    ``auto_release_time`` (pottery's, in seconds) is the ``unique_ttl`` given to :func:`lock` (ms), by
    default the actor's.  Redis errors raise pottery's ``QuorumIsImpossible`` (``raise_on_redis_errors`` is
    on): a blocking ``acquire()`` with its Redis down fails, it does not wait on.

    Attributes:
      unique_key: the key (``<actor name>:<digest>``), as job rows carry it in ``unique_key``.
      group: the parking group of the key's waiting jobs, as their rows carry it in ``parked_on``.
    """

    __slots__ = ("suite", "unique_key", "group", "_name")

    def __init__(self, *, suite: Suite, unique_key: str, ttl_ms: float) -> None:
        name = suite.keys.execution_lock(unique_key)
        super().__init__(key=name, masters=list(suite.locks.clients), raise_on_redis_errors=True,
                         auto_release_time=ttl_ms / 1000)
        self.suite = suite
        self.unique_key = unique_key
        self.group = lock_group(unique_key)
        self._name = name

    def release(self, *, raise_on_redis_errors: Optional[bool] = None) -> None:
        """pottery's release, then the key's next parked job is woken (also when the release
        raised: the lease may have run out with jobs waiting)."""
        try:
            super().release(raise_on_redis_errors=raise_on_redis_errors)
        finally:
            parking = lot.of(self.suite)
            gate = parking.gate_for(self.group)
            try:
                if gate is None:  # no ExecutionLocks in this process: a worker's watchdog wakes them now
                    parking.wakeups.rescore(self.group, 0)
                else:  # taken here and handed to the next parked job, as a job leaving the lock would
                    parking.wake_if_flagged(gate, self.group)
            except Exception:
                logger.warning("Released %s but could not wake its waiting jobs: the watchdog wakes them.",
                               self.group, exc_info=True)

    def held(self, *, raise_on_redis_errors: Optional[bool] = None) -> float:
        """pottery's ``locked()``: the seconds left on this object's own hold; 0 if it holds nothing."""
        return super().locked(raise_on_redis_errors=raise_on_redis_errors)

    def locked(self, *, raise_on_redis_errors: Optional[bool] = None) -> float:
        """The seconds left on the key's hold, whoever holds it: this object (pottery's answer),
        a job of the key, or another process; 0 if it is free."""
        own = self.held(raise_on_redis_errors=raise_on_redis_errors)
        if own:
            return own
        try:
            return self.suite.locks.pttl(self._name) / 1000
        except RedisUnavailable as e:
            if raise_on_redis_errors is False or (raise_on_redis_errors is None and not self.raise_on_redis_errors):
                return 0
            raise QuorumIsImpossible(self.key, self.masters) from e

    def __enter__(self) -> KeyLock:
        super().__enter__()
        return self

    def __exit__(self, exc_type: Optional[type[BaseException]], exc_value: Optional[BaseException],
                 traceback: Optional[TracebackType]) -> Literal[False]:
        # pottery's __exit__ calls Redlock.release by its mangled name, not this release.
        self.release()
        return False


def lock(actor: dramatiq.Actor, *args: Any, unique_ttl: Optional[int] = None, **kwargs: Any) -> KeyLock:
    """A pottery Redlock on the execution lock that ``actor.send(*args, **kwargs)``'s job would take.

    The key is computed as a worker computes it (``unique_args`` bound through the actor's signature, from
    the arguments as a message carries them), so ``lock(sync, 42)`` and ``lock(sync, customer_id=42)`` hold
    the same key.  With ``unique_args`` a list of names, only those arguments are needed (the others do not
    change the key); with ``True`` or a callable, the arguments a send would give.

    ``unique_ttl`` (ms) is the lock's lease, pottery's ``auto_release_time``: by default the actor's
    ``unique_ttl`` (60 s unless set); ``extend()`` renews it.  Nothing is taken until ``acquire()`` or
    ``with``.

    Raises :class:`InvalidOption` for what is not an actor, an actor without ``unique_args`` or whose
    ``unique_lock`` takes no execution lock (``until_executing``, ``until_executed``, ``until_expired``),
    arguments that do not fit it, and a bad ``unique_ttl``.
    """
    if not isinstance(actor, dramatiq.Actor):
        raise InvalidOption(f"lock() takes an actor (a function declared with @dramatiq.actor), not {opt.show(actor)}")
    suite = current()
    config = suite.actor_config(actor.actor_name)
    spec = config.unique_args if config is not None else None
    if config is None or spec is None:
        raise InvalidOption(f"lock() holds a unique key: {actor.actor_name} has no unique_args")
    lock_type = config.unique_lock
    if lock_type not in opt.EXECUTION_LOCKS:
        raise InvalidOption(
            f"lock() holds a key's execution lock: {actor.actor_name} has unique_lock={lock_type!r}, which takes "
            f"none (only {' and '.join(repr(t) for t in sorted(opt.EXECUTION_LOCKS))} do)"
        )
    opt.validate({"unique_ttl": unique_ttl}, config.fn)
    ttl = unique_ttl if unique_ttl is not None else config.unique_ttl
    return KeyLock(suite=suite, unique_key=_key(config, spec, actor.message(*args, **kwargs)), ttl_ms=float(ttl))


def _key(config: ActorConfig, spec: opt.ArgsSpec, message: dramatiq.Message) -> str:
    """The unique key of ``message``'s arguments, as a worker derives it for the execution lock."""
    # Through the message encoder, as a worker sees them (a tuple becomes a list, for one).
    carried = dramatiq.Message.decode(message.encode())
    if not isinstance(spec, (list, tuple)):  # True (every argument) or a callable: as a send has them
        key = derive_key(config.actor_name, config.fn, spec, carried.args, carried.kwargs)
        assert key is not None
        return key
    # Named parameters: those are the key, the others may be left out.
    try:
        given = inspect.signature(config.fn).bind_partial(*carried.args, **carried.kwargs)
    except TypeError as e:
        raise InvalidOption(f"the arguments do not fit {config.fn.__qualname__}(): {e}") from None
    given.apply_defaults()
    missing = [name for name in spec if name not in given.arguments]
    if missing:
        raise InvalidOption(f"lock() needs the arguments of {config.actor_name}'s key: {', '.join(missing)} missing")
    # derive_key's form, over the named parameters only.
    return f"{config.actor_name}:{digest(canonical({name: given.arguments[name] for name in spec}))}"
