"""Held locks and slot groups: ``locks`` and ``slots``.

Both read Redis by SCAN under the suite's key prefix (an operator's
call, bounded by :data:`MAX_GROUPS`; never on a hot path), then ask the
job tables who the holders and waiters are (:mod:`dramatiq_unique.ops.gates`).
Keys are shown in words from a holder's or a waiter's row
(:mod:`dramatiq_unique.ops.labels`); a group whose jobs are all gone
shows its hash.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator, Optional

import redis as redis_lib

from dramatiq_unique.errors import RedisUnavailable
from dramatiq_unique.ops import gates, labels
from dramatiq_unique.ops.views import LockView, SlotGroupView
from dramatiq_unique.parking.groups import SLOT, lock_group, slot_group, whole_actor
from dramatiq_unique.redis.keys import LOCK_PREFIX
from dramatiq_unique.slots.gate import gate_of, has_slots
from dramatiq_unique.storage.jobs import db_errors

if TYPE_CHECKING:
    from dramatiq_unique.storage.models import JobModel
    from dramatiq_unique.suite import Suite

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


def _groups(suite: "Suite") -> list[str]:
    """Every slot group known: holders or limits in Redis, rows parked, actors declared with slots."""
    keys = suite.keys
    names: set[str] = set()
    for prefix in (keys.slots(""), keys.limit("")):
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
    """Each slot group (of ``actor``, or all): its limit, holders, waiters and halted state."""
    gate = gate_of(suite)
    running: dict[str, dict[str, list[int]]] = {}
    views: list[SlotGroupView] = []
    for key in _groups(suite):
        name = _actor(key)
        if actor is not None and name != actor:
            continue
        config = suite.actor_config(name)
        if config is not None and not has_slots(config):
            continue
        group = slot_group(key)
        status = gate.status(group)
        held, limit = status.held, status.limit
        with db_errors("reading a slot group's jobs"):
            if name not in running:
                running[name] = gates.slot_holders(suite, name)
            holders = running[name].get(key, [])
            ids, total = gates.waiters(suite, name, group)
            sample = None
            if key.endswith(":all") and config is not None and config.options.get("concurrency_key") is None:
                text = "(all)"
            else:
                sample = gates.one_row(suite, name, group) or _holder_row(suite, name, holders)
                text = labels.render(config, "concurrency_key", sample, key) if sample else labels.short(key)
        views.append(SlotGroupView(
            actor=name, key=text, group=key, limit=None if limit < 0 else limit, held=held, holders=holders,
            waiters=ids, waiting=total, halted=limit == 0,
        ))
    return views


def _holder_row(suite: "Suite", actor: str, ids: list[int]) -> Optional["JobModel"]:
    if not ids:
        return None
    for table in gates.tables(suite, actor):
        row = table.select().where(table.id == ids[0]).first()
        if row is not None:
            return row
    return None
