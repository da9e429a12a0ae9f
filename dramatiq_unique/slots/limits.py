"""Run-time concurrency limits: :func:`set_concurrency_limit` and :func:`concurrency_status`.

Limits set here live in Redis (see :mod:`dramatiq_unique.slots.gate`), so
every worker's next decision uses them.  Raising a limit wakes parked
jobs at once, one per newly free slot; lowering it lets running jobs
finish and starts nothing new until the group is under the new limit;
``0`` halts a group (its jobs stay parked, nothing is lost).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Optional

import peewee as pw
import redis as redis_lib

from dramatiq_unique import suite as _config
from dramatiq_unique.errors import InvalidOption, RedisUnavailable
from dramatiq_unique.parking import lot
from dramatiq_unique.parking.groups import slot_group, slot_groups_of, whole_actor
from dramatiq_unique.slots.gate import declared_limit, gate_of, has_slots
from dramatiq_unique.storage.models import JobStatus
from dramatiq_unique.unique.keys import canonical, digest

if TYPE_CHECKING:
    from dramatiq_unique.suite import ActorConfig, Suite

#: Jobs one call wakes per group at most (a limit raised by more than this fills up as jobs finish).
MAX_WAKE = 1_000


@dataclasses.dataclass(frozen=True)
class ConcurrencyStatus:
    """What :func:`concurrency_status` reports for a group (or, ``key=None`` on a keyed actor, for all of them)."""

    actor_name: str
    key: Any
    #: The limit in force: the override if one is set, else ``default``; None means no limit.
    limit: Optional[int]
    #: The actor's declared ``concurrency_limit`` (None: none declared).
    default: Optional[int]
    #: The run-time override at this level (``set_concurrency_limit``), or None.
    override: Optional[int]
    #: Jobs holding a slot now (their lease has not run out).
    holders: int
    #: Jobs parked, waiting for a slot.
    parked: int


def _check_limit(limit: Any) -> None:
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise InvalidOption(f"a concurrency limit must be a whole number, 0 or more, or None, not {limit!r}")


def _slot_config(suite: "Suite", actor_name: str) -> "ActorConfig":
    config = suite.actor_config(actor_name)
    if config is None:
        raise InvalidOption(f"no actor {actor_name!r} with concurrency slots is declared in this process")
    if not has_slots(config):
        raise InvalidOption(f"actor {actor_name!r} declares neither concurrency_limit nor concurrency_key")
    return config


def key_group(config: "ActorConfig", key: Any) -> str:
    """The group key that ``key`` names, as the worker derives it from a message's arguments.

    ``key`` is the value of the ``concurrency_key`` parameter when it
    names one (``key="acme"``, or ``key=42`` for an int argument: the
    type matters), a dict of parameter values when it names several (a
    tuple in their order also works), the string the callable returns
    when it is a callable, and a dict of every argument (defaults
    included) when it is ``True``.
    """
    spec = config.options.get("concurrency_key")
    name = config.actor_name
    if spec is None:
        raise InvalidOption(f"actor {name!r} has no concurrency_key: set its limit with key=None")
    if callable(spec) and not isinstance(spec, (list, tuple)):
        if not isinstance(key, str):
            raise InvalidOption(f"actor {name!r}'s concurrency_key is a callable: key must be the str it returns")
        selected: Any = key
    elif spec is True:
        if not isinstance(key, dict):
            raise InvalidOption(f"actor {name!r}'s concurrency_key is True: key must be a dict of all its arguments")
        selected = key
    else:
        names = list(spec)
        if isinstance(key, dict):
            if set(key) != set(names):
                raise InvalidOption(f"key for {name!r} must name exactly {names}, not {sorted(key)}")
            selected = {n: key[n] for n in names}
        elif len(names) == 1:
            selected = {names[0]: key}
        elif isinstance(key, (list, tuple)) and len(key) == len(names):
            selected = dict(zip(names, key, strict=True))
        else:
            raise InvalidOption(f"key for {name!r} must be a dict of {names} (or a tuple in that order)")
    return f"{name}:{digest(canonical(selected))}"


def _target(suite: "Suite", config: "ActorConfig", key: Any) -> tuple[str, Optional[str]]:
    """(the Redis key of the override, the one group it limits, or None for all the actor's groups)."""
    if key is not None:
        group = key_group(config, key)
        return suite.keys.limit(group), slot_group(group)
    if config.options.get("concurrency_key") is None:
        return suite.keys.actor_limit(config.actor_name), slot_group(whole_actor(config.actor_name))
    return suite.keys.actor_limit(config.actor_name), None


def _parked_groups(config: "ActorConfig") -> list[str]:
    model = config.model
    prefix = slot_groups_of(config.actor_name)
    query = (
        model.select(model.parked_on)
        .where(
            (model.app == config.app) & (model.status == JobStatus.PENDING.value)
            & (pw.fn.SUBSTR(model.parked_on, 1, len(prefix)) == prefix)
        )
        .distinct()
    )
    return [job.parked_on for job in query if job.parked_on is not None]


def wake_free(suite: "Suite", group: str, most: int = MAX_WAKE) -> int:
    """Start parked jobs of ``group`` while it has free slots; returns how many were woken."""
    gate, spot = gate_of(suite), lot.of(suite)
    info = gate.describe(group)
    if info is None:
        return 0
    woken = 0
    while woken < most:
        token = gate.take(group, info.ttl_ms)
        if token is None:
            break
        if spot.pass_on(gate, group, token) is None:  # nobody (due) parked: the slot was released
            break
        woken += 1
    return woken


def set_concurrency_limit(
    actor_name: str, limit: Optional[int], key: Any = None, *, suite: Optional["Suite"] = None,
) -> int:
    """Change a slot limit at run time, for every worker at once; returns the jobs it started.

    ``key=None`` sets the limit of all the actor's groups (those without
    a limit of their own); a ``key`` sets one group's (a tenant's).
    ``0`` halts: running jobs finish, nothing new starts, parked jobs
    wait.  ``None`` removes the override at that level: the group falls
    back to the actor's override, then to the declared
    ``concurrency_limit``.  Raising a limit starts parked jobs at once,
    one per newly free slot, in their order.  Overrides live in Redis:
    a Redis that loses its data forgets them (the declared limits apply).
    """
    _check_limit(limit)
    suite = suite or _config.current()
    config = _slot_config(suite, actor_name)
    redis_key, group = _target(suite, config, key)
    try:
        if limit is None:
            suite.redis.delete(redis_key)
        else:
            suite.redis.set(redis_key, int(limit))
    except redis_lib.RedisError as e:
        raise RedisUnavailable(f"setting the concurrency limit of {actor_name!r}: {e}") from e
    groups = [group] if group is not None else _parked_groups(config)
    return sum(wake_free(suite, g) for g in groups)


def concurrency_status(actor_name: str, key: Any = None, *, suite: Optional["Suite"] = None) -> ConcurrencyStatus:
    """The limit, holders and parked jobs of a group (``key`` as for :func:`set_concurrency_limit`).

    With ``key=None`` on an actor that has a ``concurrency_key``: the
    actor-wide limit, and holders and parked jobs summed over its groups
    (which scans the suite's slot keys in Redis: an operator's call, not
    one for a hot path).
    """
    suite = suite or _config.current()
    config = _slot_config(suite, actor_name)
    gate = gate_of(suite)
    declared = config.options.get("concurrency_limit")
    _, group = _target(suite, config, key)
    model = config.model
    waiting = (model.app == suite.app) & (model.status == JobStatus.PENDING.value)  # another app's are not ours
    if group is not None:
        holders, limit, own, actor_wide, _ = gate.status(group, declared_limit(config))
        override = own if key is not None else actor_wide
        parked = model.select().where(waiting & (model.parked_on == group)).count()
    else:
        holders, override = _all_holders(suite, config), _actor_override(suite, actor_name)
        limit = declared_limit(config) if override is None else override
        prefix = slot_groups_of(actor_name)
        parked = model.select().where(waiting & (pw.fn.SUBSTR(model.parked_on, 1, len(prefix)) == prefix)).count()
    return ConcurrencyStatus(actor_name, key, None if limit < 0 else limit, declared, override, holders, parked)


def _actor_override(suite: "Suite", actor_name: str) -> Optional[int]:
    try:
        value = suite.redis.get(suite.keys.actor_limit(actor_name))
    except redis_lib.RedisError as e:
        raise RedisUnavailable(f"reading the concurrency limit of {actor_name!r}: {e}") from e
    return None if value is None else int(value)


def _all_holders(suite: "Suite", config: "ActorConfig") -> int:
    gate = gate_of(suite)
    pattern = suite.keys.slots(f"{_glob_escape(config.actor_name)}:*")
    slots_prefix = suite.keys.slots("")
    total = 0
    try:
        for raw in suite.redis.scan_iter(match=pattern, count=1000):
            name = raw.decode() if isinstance(raw, bytes) else raw
            total += gate.status(slot_group(name[len(slots_prefix):]), declared_limit(config))[0]
    except redis_lib.RedisError as e:
        raise RedisUnavailable(f"reading the concurrency slots of {config.actor_name!r}: {e}") from e
    return total


def _glob_escape(text: str) -> str:
    return "".join(f"\\{c}" if c in "*?[]\\" else c for c in text)
