"""Held locks and slot groups: ``locks`` and ``slots``.

Both read Redis by SCAN under the suite's key prefix (an operator's
call, bounded by :data:`MAX_GROUPS`; never on a hot path), then ask the
job tables who the holders and waiters are (:mod:`dramatiq_unique.ops.gates`).
Keys are shown in words from a holder's or a waiter's row
(:mod:`dramatiq_unique.ops.labels`), else from the run-time limit kept for
the group (:mod:`dramatiq_unique.slots.overrides`); a group with neither
shows its hash.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator, Optional

import redis as redis_lib

from dramatiq_unique.errors import RedisUnavailable
from dramatiq_unique.ops import gates, labels, words
from dramatiq_unique.ops.views import LockView, OverrideView, SlotGroupView
from dramatiq_unique.parking.groups import SLOT, lock_group, slot_group, whole_actor
from dramatiq_unique.redis.keys import LOCK_PREFIX
from dramatiq_unique.slots import overrides
from dramatiq_unique.slots.gate import GroupStatus, gate_of
from dramatiq_unique.storage.jobs import db_errors

if TYPE_CHECKING:
    from dramatiq_unique.storage.models import JobModel
    from dramatiq_unique.suite import ActorConfig, Suite

#: Locks or slot groups one call lists at most.
MAX_GROUPS = 500


def _glob(text: str) -> str:
    return "".join(f"\\{c}" if c in "*?[]\\" else c for c in text)


def _scan(suite: "Suite", prefix: str) -> Iterator[str]:
    """The rest of each Redis key that starts with ``prefix`` (at most MAX_GROUPS)."""
    try:
        for i, raw in enumerate(suite.redis.scan_iter(match=_glob(prefix) + "*", count=1000)):
            if i >= MAX_GROUPS:
                return
            name = raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)
            yield name[len(prefix):]
    except redis_lib.RedisError as e:
        raise RedisUnavailable(f"listing {prefix}*: {e}") from e


def _actor(unique_key: str) -> str:
    return unique_key.rsplit(":", 1)[0]


def locks(suite: "Suite") -> list[LockView]:
    """Held execution locks (``run``) and queue locks (``queue``), execution locks first,
    each with its holder, time left, fencing token and waiters in order."""
    found: list[LockView] = []
    for kind, name_of in (("run", suite.keys.execution_lock), ("queue", suite.keys.queue_lock)):
        prefix = f"{LOCK_PREFIX}:{name_of('')}"
        for unique_key in sorted(_scan(suite, prefix)):
            left = suite.locks.pttl(name_of(unique_key))
            if left <= 0:
                continue  # ran out between the scan and now
            with db_errors("reading a lock's jobs"):
                found.append(_lock(suite, kind, unique_key, left))
    return found


def _lock(suite: "Suite", kind: str, unique_key: str, left: float) -> LockView:
    actor = _actor(unique_key)
    holder = (gates.lock_holder if kind == "run" else gates.queue_holder)(suite, actor, unique_key)
    group = lock_group(unique_key)
    ids, total = gates.waiters(suite, actor, group) if kind == "run" else ([], 0)
    sample = holder or (gates.one_row(suite, actor, group) if kind == "run" else None)
    config = suite.actor_config(actor)
    key = labels.render(config, "unique_args", sample, unique_key) if sample else labels.short(unique_key)
    return LockView(
        kind=kind, actor=actor, key=key, unique_key=unique_key, holder=holder.id if holder else None,
        holder_message_id=holder.message_id if holder else None,
        token=holder.fencing_token if holder and kind == "run" else None, left_ms=left,
        waiters=ids, waiting=total,
    )


def known_groups(suite: "Suite", kept: Optional[list[overrides.Override]] = None, *, limits: bool = True) -> list[str]:
    """Every slot group known: holders in Redis, rows parked, actors declared with slots, and (``limits``)
    the groups with a limit set at run time, kept or in Redis."""
    keys = suite.keys
    names: set[str] = set()
    if limits:
        if kept is None:
            with db_errors("reading the run-time limits"):
                kept = overrides.listing(suite)
        names.update(o.group for o in kept if o.group)
    for prefix in (keys.slots(""), keys.limit("")) if limits else (keys.slots(""),):
        names.update(_scan(suite, prefix))
    for config in suite.actors.values():
        if config.options.get("concurrency_limit") is not None and config.options.get("concurrency_key") is None:
            names.add(whole_actor(config.actor_name))
    with db_errors("listing the parked slot groups"):
        for table in suite.models:
            query = (
                table.select(table.parked_on)
                .where((table.app == suite.app) & (table.status == gates.PENDING)
                       & table.parked_on.startswith(f"{SLOT}:"))
                .distinct().limit(MAX_GROUPS)
            )
            names.update(row.parked_on[len(SLOT) + 1:] for row in query if row.parked_on)
    return sorted(names)[:MAX_GROUPS]


def slots(suite: "Suite", *, actor: Optional[str] = None) -> list[SlotGroupView]:
    """Each slot group (of ``actor``, or all): its limit and where it comes from, every holder the
    job tables name, waiters, halted state, and what the numbers need said."""
    gate = gate_of(suite)
    running: dict[str, dict[str, list[int]]] = {}
    views: list[SlotGroupView] = []
    with db_errors("reading the run-time limits"):
        kept = overrides.listing(suite)
    for key in known_groups(suite, kept):
        name = _actor(key)
        if actor is not None and name != actor:
            continue
        config = suite.actor_config(name)
        if config is not None and not config.has_slots:
            continue
        group = slot_group(key)
        status = gate.status(group)
        with db_errors("reading a slot group's jobs"):
            if name not in running:
                running[name] = gates.slot_holders(suite, name)
            queued = [row.id for row in gates.woken_holders(suite, name, status.waiting_holders)]
            holders = sorted(set(running[name].get(key, [])) | set(queued))
            ids, total = gates.waiters(suite, name, group)
            own = next((o for o in kept if o.group == key), None)
            if key.endswith(":all") and config is not None and config.options.get("concurrency_key") is None:
                text = "(all)"
            else:
                sample = gates.one_row(suite, name, group) or _holder_row(suite, name, holders)
                if sample is not None:
                    text = labels.render(config, "concurrency_key", sample, key)
                else:
                    text = own.words if own is not None and own.words else labels.short(key)
        limit, source = _limit(suite, config, name, key, status, kept)
        views.append(SlotGroupView(
            actor=name, key=text, group=key, limit=limit, held=status.held, holders=holders,
            waiters=ids, waiting=total, halted=limit == 0, limit_from=source, queued_holders=queued,
            note=_note(status, limit, holders),
        ))
    return views


def _limit(
    suite: "Suite", config: Optional["ActorConfig"], actor: str, key: str, status: GroupStatus,
    kept: list[overrides.Override],
) -> tuple[Optional[int], str]:
    """The group's limit in force, and where it comes from (see :class:`SlotGroupView`)."""
    if status.loaded:
        own, actor_wide = status.own, status.actor
    else:  # Redis lost them, and this suite may not put them back: the database's record
        own = next((o.limit for o in kept if o.actor == actor and o.group == key), None)
        actor_wide = next((o.limit for o in kept if o.actor == actor and not o.group), None)
    for value, source in ((own, "override"), (actor_wide, "actor override"), (status.message, "message")):
        if value is not None:
            return value, source
    if config is None:
        return None, "unknown"  # declared by the app, which this process did not import
    declared = config.options.get("concurrency_limit")
    return (None, "none") if declared is None else (int(declared), "declared")


def _note(status: GroupStatus, limit: Optional[int], holders: list[int]) -> str:
    notes = [words.over_limit(status.held, limit)]
    if status.held > len(holders):
        missing = status.held - len(holders)
        notes.append(f"{missing} holder{'s' if missing > 1 else ''} not in the job tables (another app's "
                     "rows, or a slot being handed on)")
    if not status.loaded:
        notes.append("Redis lost the run-time limits: shown from the database; the app's workers put them back "
                     "at their next slot decision")
    return "; ".join(n for n in notes if n)


def limits(suite: "Suite", *, actor: Optional[str] = None) -> list[OverrideView]:
    """The limits set at run time (of ``actor``, or all), as the database keeps them, with their words."""
    with db_errors("reading the run-time limits"):
        kept = overrides.listing(suite, actor)
    return [OverrideView(actor=o.actor, key=_words(suite, o), group=o.group, limit=o.limit, set_at=o.set_at)
            for o in kept]


def _words(suite: "Suite", kept: overrides.Override) -> str:
    if not kept.group:
        return "(all)"
    if kept.words:
        return kept.words
    config = suite.actor_config(kept.actor)
    if config is not None and config.options.get("concurrency_key") is None:
        return "(all)"
    return labels.short(kept.group)


def _holder_row(suite: "Suite", actor: str, ids: list[int]) -> Optional["JobModel"]:
    if not ids:
        return None
    for table in gates.tables(suite, actor):
        row = table.select().where(table.id == ids[0]).first()
        if row is not None:
            return row
    return None
