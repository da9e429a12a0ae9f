"""Run-time concurrency limits: :func:`set_concurrency_limit` and :func:`concurrency_status`.  Kept in
the database and copied to Redis (:mod:`dramatiq_unique.slots.overrides`), where every worker's next
decision reads them.  A raised limit wakes parked jobs at once; 0 halts a group."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Optional

from dramatiq_unique import suite as _config
from dramatiq_unique.errors import InvalidOption, redis_errors
from dramatiq_unique.parking import lot
from dramatiq_unique.parking.groups import slot_group, slot_groups_of, whole_actor
from dramatiq_unique.redis.keys import glob_escape
from dramatiq_unique.slots import overrides
from dramatiq_unique.slots.gate import declared_limit, gate_of
from dramatiq_unique.unique.keys import canonical, digest

if TYPE_CHECKING:
    from dramatiq_unique.suite import ActorConfig, Suite

#: The largest limit (the limits' table keeps a 32-bit integer).
MAX_LIMIT = 2**31 - 1
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
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or not 0 <= limit <= MAX_LIMIT):
        raise InvalidOption(f"a concurrency limit must be a whole number from 0 to {MAX_LIMIT}, or None, "
                            f"not {str(limit)[:40]!r}")


def _slot_config(suite: "Suite", actor_name: str) -> "ActorConfig":
    config = suite.actor_config(actor_name)
    if config is None:
        raise InvalidOption(f"no actor {actor_name!r} with concurrency slots is declared in this process")
    if not config.has_slots:
        raise InvalidOption(f"actor {actor_name!r} declares neither concurrency_limit nor concurrency_key")
    return config


def key_group(config: "ActorConfig", key: Any) -> str:
    """The group key that ``key`` names, as the worker derives it from a message's arguments: the value of
    the one ``concurrency_key`` parameter (its type matters), a dict (or tuple) of several, the str a key
    callable returns, or a dict of every argument, defaults included, for ``True``."""
    return f"{config.actor_name}:{digest(canonical(_selected(config, key)))}"


def _selected(config: "ActorConfig", key: Any) -> Any:
    """What the digest of ``key``'s group is taken of (InvalidOption for a key the actor cannot have)."""
    spec = config.options.get("concurrency_key")
    name = config.actor_name
    if spec is None:
        raise InvalidOption(f"actor {name!r} has no concurrency_key: set its limit with key=None")
    if callable(spec) and not isinstance(spec, (list, tuple)):
        if not isinstance(key, str):
            raise InvalidOption(f"actor {name!r}'s concurrency_key is a callable: key must be the str it returns")
        return key
    if spec is True:
        if not isinstance(key, dict):
            raise InvalidOption(f"actor {name!r}'s concurrency_key is True: key must be a dict of all its arguments")
        return key
    names = list(spec)
    if isinstance(key, dict):
        if set(key) != set(names):
            raise InvalidOption(f"key for {name!r} must name exactly {names}, not {sorted(key)}")
        return {n: key[n] for n in names}
    if len(names) == 1:
        return {names[0]: key}
    if isinstance(key, (list, tuple)) and len(key) == len(names):
        return dict(zip(names, key, strict=True))
    raise InvalidOption(f"key for {name!r} must be a dict of {names} (or a tuple in that order)")


def key_words(config: "ActorConfig", key: Any) -> str:
    """``key`` in words, as the operator's views show keys: ``customer=42 region=eu`` (a str
    value bare, others as JSON), or the str a key callable returns."""
    selected = _selected(config, key)
    if not isinstance(selected, dict):
        return str(selected)
    return " ".join(f"{name}={value if isinstance(value, str) else canonical(value)}"
                    for name, value in selected.items())


def set_concurrency_limit(actor_name: str, limit: Optional[int], key: Any = None, *,
                          suite: Optional["Suite"] = None) -> int:
    """Change a slot limit at run time, for every worker at once; returns the jobs it started.

    ``key=None`` sets the limit of all the actor's groups (those without a limit of their own); a ``key``
    sets one group's (a tenant's). ``0`` halts: running jobs finish, nothing new starts, parked jobs wait.
    ``None`` removes the override at that level: the group falls back to the actor's override, then to the
    declared ``concurrency_limit``.  Raising a limit starts parked jobs at once, one per newly free slot, in
    their order.  Overrides are kept in the database (the primary store) and copied to Redis: a Redis that
    loses its data gets them back before its next slot decision.  Called inside a transaction of the
    caller's, the row commits or rolls back with it (Redis's copy is written at once: call it outside one).
    """
    suite = suite or _config.current()
    if key is None:
        return set_group_limit(actor_name, "", limit, suite=suite)
    config = _slot_config(suite, actor_name)
    words = key_words(config, key)
    return set_group_limit(actor_name, key_group(config, key), limit, suite=suite, words=words, key=key)


def set_group_limit(actor_name: str, group: str, limit: Optional[int], *, suite: "Suite", words: Optional[str] = None,
                    key: Any = None) -> int:
    """:func:`set_concurrency_limit` for a level named by its group key, as the operator's surfaces list
    them: '' for the actor's own limit, else ``<actor>:<digest>``, whether or not a job has its key.
    ``words``/``key``: the key, kept with the override (an override's own are kept when not given)."""
    _check_limit(limit)
    config = _slot_config(suite, actor_name)
    keyed = config.options.get("concurrency_key") is not None
    if group == whole_actor(actor_name) and not keyed:
        group = ""
    if group and (not keyed or group.rsplit(":", 1)[0] != actor_name):
        raise InvalidOption(f"{group!r} is not a slot group of actor {actor_name!r}")
    if group and words is None and limit is not None:
        kept = overrides.find(suite, actor_name, group)
        if kept is not None:
            words, key = kept.words, kept.key
    overrides.write(suite, actor_name, group, limit, words=words, key=key)
    if group:
        groups = [slot_group(group)]
    elif not keyed:
        groups = [slot_group(whole_actor(actor_name))]
    else:
        groups = lot.parked_on(config.model, config.app, slot_groups_of(actor_name))
    gate, spot, woken = gate_of(suite), lot.of(suite), 0
    for each in groups:  # its parked jobs started while it has free slots
        for _ in range(MAX_WAKE):
            if spot.wake(gate, each) is None:  # no free slot, or nobody (due) parked
                break
            woken += 1
    return woken


def concurrency_status(actor_name: str, key: Any = None, *, suite: Optional["Suite"] = None) -> ConcurrencyStatus:
    """The limit, holders and parked jobs of a group (``key`` as for :func:`set_concurrency_limit`).

    With ``key=None`` on an actor that has a ``concurrency_key``: the actor-wide limit, and holders and parked jobs
    summed over its groups (which scans the suite's slot keys in Redis: an operator's call, not one for a hot path).
    """
    suite = suite or _config.current()
    config = _slot_config(suite, actor_name)
    return _status(suite, config, key, "" if key is None else key_group(config, key))


def group_status(actor_name: str, group: str, *, suite: "Suite") -> ConcurrencyStatus:
    """:func:`concurrency_status` of a level named by its group key, as :func:`set_group_limit` takes it."""
    config = _slot_config(suite, actor_name)
    if group in ("", whole_actor(actor_name)) or config.options.get("concurrency_key") is None:
        return _status(suite, config, None, "")
    kept = overrides.find(suite, actor_name, group)
    return _status(suite, config, kept.key if kept is not None else None, group)


def _status(suite: "Suite", config: "ActorConfig", key: Any, level: str) -> ConcurrencyStatus:
    """``level``: a group key, or '' for the actor's own limit (all its groups, or its one group unkeyed)."""
    actor_name, gate = config.actor_name, gate_of(suite)
    if level:
        group: Optional[str] = slot_group(level)
    else:
        group = None if config.options.get("concurrency_key") is not None else slot_group(whole_actor(actor_name))
    declared = config.options.get("concurrency_limit")
    model = config.model
    if group is not None:
        status = gate.status(group, declared_limit(config))
        holders, limit = status.held, status.limit
        override = status.own if level else status.actor
        parked = model.select().where(lot.parked(model, suite.app) & (model.parked_on == group)).count()
    else:
        kept = overrides.find(suite, actor_name, "")
        holders, override = 0, None if kept is None else kept.limit
        limit = declared_limit(config) if override is None else override
        slots = suite.keys.slots("")
        with redis_errors(f"reading the concurrency slots of {actor_name!r}"):  # summed over the actor's groups
            for raw in suite.redis.scan_iter(match=suite.keys.slots(f"{glob_escape(actor_name)}:*"), count=1000):
                name = raw.decode() if isinstance(raw, bytes) else raw
                holders += gate.status(slot_group(name[len(slots):]), declared_limit(config)).held
        parked = model.select().where(lot.parked(model, suite.app, slot_groups_of(actor_name))).count()
    return ConcurrencyStatus(actor_name, key, None if limit < 0 else limit, declared, override, holders, parked)
