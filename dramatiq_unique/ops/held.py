"""Who holds a lock or a slot group and who waits for it: ``locks``, ``slots`` and ``limits``.  Redis
knows a gate's holders only by token, so a holder's job is the ``running`` row of the key (and, for a
slot group, the ``queued`` rows the gate noted as woken with a slot); waiters are the rows parked on
the group, in the order they start.  Groups are found by SCAN, bounded."""

from __future__ import annotations

import functools
import itertools
from typing import Any, Iterator, Optional

import redis as redis_lib

from dramatiq_unique import options as opt
from dramatiq_unique.errors import RedisUnavailable
from dramatiq_unique.guard import guarded
from dramatiq_unique.ops.views import LockView, OverrideView, SlotGroupView
from dramatiq_unique.ops.words import over_limit, render, short
from dramatiq_unique.parking.groups import SLOT, lock_group, slot_group, whole_actor
from dramatiq_unique.redis.keys import LOCK_PREFIX, glob_escape
from dramatiq_unique.slots import overrides
from dramatiq_unique.slots.gate import GroupStatus, gate_of, group_key
from dramatiq_unique.storage.models import JobModel, JobStatus
from dramatiq_unique.suite import ActorConfig, Suite

#: Locks or slot groups one call lists at most.
MAX_GROUPS = 500
#: Waiters named in a view; and how many are counted at most (a count past it reads "1000+").
NAMED_WAITERS = 10
MAX_COUNTED = 1_000
#: Running rows of one actor read to find its slot holders.
MAX_RUNNING = 1_000

PENDING, QUEUED, RUNNING = JobStatus.PENDING.value, JobStatus.QUEUED.value, JobStatus.RUNNING.value


def tables(suite: "Suite", actor: str) -> list[type[JobModel]]:
    """The primary's job tables a group of ``actor`` lives in (gates and parking use the primary only)."""
    config = suite.actor_config(actor)
    return [config.model] if config is not None else list(suite.models)


def _first(suite: "Suite", actor: str, cond: Any, order: Any = lambda table: ()) -> Optional[JobModel]:
    """The first row (by ``order(table)``) of ``actor``'s tables for which ``cond(table)`` holds, or None."""
    for table in tables(suite, actor):
        row = table.select().where(cond(table)).order_by(*order(table)).first()
        if row is not None:
            return row
    return None


def _order(config: Optional["ActorConfig"]) -> str:
    return config.unique_order_by if config else opt.DEFAULT_UNIQUE_ORDER_BY


def _parked(suite: "Suite", table: type[JobModel], group: str) -> Any:
    return (table.app == suite.app) & (table.parked_on == group) & (table.status == PENDING)


def waiters(suite: "Suite", actor: str, group: str) -> tuple[list[int], int]:
    """The first waiters' ids of ``group``, in order, and how many wait (at most MAX_COUNTED + 1)."""
    config = suite.actor_config(actor)
    ids: list[int] = []
    total = 0
    for table in tables(suite, actor):
        cond = _parked(suite, table, group)
        first = table.created_at if _order(config) == "created_at" else table.process_after
        ids += [row.id for row in table.select(table.id).where(cond).order_by(first, table.id).limit(NAMED_WAITERS)]
        total += table.select(table.id).where(cond).limit(MAX_COUNTED + 1).count()
    return ids[:NAMED_WAITERS], min(total, MAX_COUNTED + 1)


def ahead_of(suite: "Suite", row: JobModel) -> int:
    """Rows parked on ``row``'s group that start before it (at most MAX_COUNTED + 1)."""
    table, config = type(row), suite.actor_config(row.actor_name)
    by_due = _order(config) == "process_after" and row.process_after is not None
    column, mine = (table.process_after, row.process_after) if by_due else (table.created_at, row.created_at)
    before = (column < mine) | ((column == mine) & (table.id < row.id))
    query = table.select(table.id).where(_parked(suite, table, row.parked_on or "") & before)
    return int(query.limit(MAX_COUNTED + 1).count())


def lock_holder(suite: "Suite", actor: str, unique_key: str) -> Optional[JobModel]:
    """The running row of ``unique_key`` (the newest, should a stalled one linger), or None."""
    return _first(suite, actor, lambda t: (t.app == suite.app) & (t.unique_key == unique_key) & (t.status == RUNNING),
                  lambda t: (t.fencing_token.desc(),))


def slot_holders(suite: "Suite", actor: str) -> dict[str, list[int]]:
    """{group key: ids of the running jobs in it} for ``actor``'s running rows (bounded)."""
    config = suite.actor_config(actor)
    holders: dict[str, list[int]] = {}
    if config is None:
        return holders
    table = config.model
    # No ORDER BY: SQLite would then walk the primary key to avoid a sort, rather than take the few
    # running rows by the (app, status, ...) index.
    query = table.select().where((table.app == suite.app) & (table.status == RUNNING) & (table.actor_name == actor))
    for row in sorted(query.limit(MAX_RUNNING), key=lambda r: r.id):
        key = group_of(config, row)
        if key is not None:
            holders.setdefault(key, []).append(row.id)
    return holders


def group_of(config: "ActorConfig", row: JobModel) -> Optional[str]:
    """The slot group key of ``row``'s job; None when its arguments no longer bind (an older signature)."""
    try:
        return group_key(config, row.options or {}, tuple(row.args or ()), dict(row.kwargs or {}))
    except Exception:  # whatever the binding raises: the row is in no group
        return None


def label(config: Optional["ActorConfig"], actor: str, option: str, row: JobModel, key: str) -> str:
    """A group in words: the actor, and the key ``option`` gives ``row`` (``deliver_webhook customer=42``)."""
    return " ".join(filter(None, [actor, render(config, option, row, key)]))


def group_holders(suite: "Suite", actor: str, key: str, status: GroupStatus,
                  running: Optional[dict[str, list[int]]] = None) -> tuple[list[int], list[int]]:
    """Every holder of a slot group the job tables name, and of them those the gate noted as woken with
    a slot that still wait in the broker (``queued``)."""
    queued: list[int] = []
    for table in tables(suite, actor) if status.waiting_holders else ():
        queued += [row.id for row in table.select(table.id).where(
            (table.app == suite.app) & table.message_id.in_(list(status.waiting_holders)[:MAX_RUNNING])
            & (table.status == QUEUED))]
    queued.sort()
    running = slot_holders(suite, actor) if running is None else running
    return sorted(set(running.get(key, [])) | set(queued)), queued


def _scan(suite: "Suite", prefix: str) -> Iterator[str]:
    """The rest of each Redis key that starts with ``prefix`` (at most MAX_GROUPS)."""
    try:
        for raw in itertools.islice(suite.redis.scan_iter(match=glob_escape(prefix) + "*", count=1000), MAX_GROUPS):
            name = raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)
            yield name[len(prefix):]
    except redis_lib.RedisError as e:
        raise RedisUnavailable(f"listing {prefix}*: {e}") from e


def locks(suite: "Suite") -> list[LockView]:
    """Held execution locks (``run``), then queue locks (``queue``): holder, time left, fencing
    token, waiters in order."""
    found: list[LockView] = []
    for kind, name_of in (("run", suite.keys.execution_lock), ("queue", suite.keys.queue_lock)):
        for unique_key in sorted(_scan(suite, f"{LOCK_PREFIX}:{name_of('')}")):
            left = suite.locks.pttl(name_of(unique_key))
            if left > 0:  # else it ran out between the scan and now
                with guarded("reading a lock's jobs"):
                    found.append(_lock(suite, kind, unique_key, left))
    return found


def _lock(suite: "Suite", kind: str, unique_key: str, left: float) -> LockView:
    actor, group, run = unique_key.rsplit(":", 1)[0], lock_group(unique_key), kind == "run"
    if run:
        holder = lock_holder(suite, actor, unique_key)
    else:  # the row holding the key while it waits
        holder = _first(suite, actor, lambda t: (t.app == suite.app) & (t.unique_hold == unique_key))
    ids, total = waiters(suite, actor, group) if run else ([], 0)
    sample = holder or (_first(suite, actor, lambda t: _parked(suite, t, group)) if run else None)
    key = render(suite.actor_config(actor), "unique_args", sample, unique_key) if sample else short(unique_key)
    return LockView(kind=kind, actor=actor, key=key, unique_key=unique_key, holder=holder.id if holder else None,
                    holder_message_id=holder.message_id if holder else None,
                    token=holder.fencing_token if holder and run else None, left_ms=left, waiters=ids, waiting=total)


def known_groups(suite: "Suite", kept: Optional[list[overrides.Override]] = None, *, limits: bool = True) -> list[str]:
    """Every slot group known: holders in Redis, rows parked, actors declared with slots, and (``limits``)
    the groups with a limit set at run time, kept or in Redis."""
    keys = suite.keys
    names: set[str] = set()
    if limits:
        if kept is None:
            with guarded("reading the run-time limits"):
                kept = overrides.listing(suite)
        names.update(o.group for o in kept if o.group)
    for prefix in (keys.slots(""), keys.limit("")) if limits else (keys.slots(""),):
        names.update(_scan(suite, prefix))
    for config in suite.actors.values():
        if config.options.get("concurrency_limit") is not None and config.options.get("concurrency_key") is None:
            names.add(whole_actor(config.actor_name))
    with guarded("listing the parked slot groups"):
        for table in suite.models:
            parked = (table.app == suite.app) & (table.status == PENDING) & table.parked_on.startswith(f"{SLOT}:")
            query = table.select(table.parked_on).where(parked).distinct().limit(MAX_GROUPS)
            names.update(row.parked_on[len(SLOT) + 1:] for row in query if row.parked_on)
    return sorted(names)[:MAX_GROUPS]


def slots(suite: "Suite", *, actor: Optional[str] = None) -> list[SlotGroupView]:
    """Each slot group (of ``actor``, or all): its limit and where it comes from, every holder the
    job tables name, waiters, halted state, and what the numbers need said."""
    gate = gate_of(suite)
    running = functools.cache(lambda name: slot_holders(suite, name))  # an actor's running rows, read once
    views: list[SlotGroupView] = []
    with guarded("reading the run-time limits"):
        kept = overrides.listing(suite)
    for key in known_groups(suite, kept):
        name = key.rsplit(":", 1)[0]
        config = suite.actor_config(name)
        if (actor is not None and name != actor) or (config is not None and not config.has_slots):
            continue
        group = slot_group(key)
        status = gate.status(group)
        with guarded("reading a slot group's jobs"):
            holders, queued = group_holders(suite, name, key, status, running(name))
            ids, total = waiters(suite, name, group)
            if key.endswith(":all") and config is not None and config.options.get("concurrency_key") is None:
                text = "(all)"
            else:  # a job's key in words, else the words kept with the group's limit, else its hash
                sample = _first(suite, name, lambda t, g=group: _parked(suite, t, g)) or (
                    _first(suite, name, lambda t, i=holders[0]: t.id == i) if holders else None)
                own = next((o.words for o in kept if o.group == key and o.words), None)
                text = render(config, "concurrency_key", sample, key) if sample is not None else own or short(key)
        limit, source = _limit(config, name, key, status, kept)
        views.append(SlotGroupView(actor=name, key=text, group=key, limit=limit, held=status.held, holders=holders,
                                   waiters=ids, waiting=total, halted=limit == 0, limit_from=source,
                                   queued_holders=queued, note=_note(status, limit, holders)))
    return views


def _limit(
    config: Optional["ActorConfig"], actor: str, key: str, status: GroupStatus, kept: list[overrides.Override],
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
    notes = [over_limit(status.held, limit)]
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
    with guarded("reading the run-time limits"):
        kept = overrides.listing(suite, actor)
    return [OverrideView(actor=o.actor, key=_words(suite, o), group=o.group, limit=o.limit, set_at=o.set_at)
            for o in kept]


def _words(suite: "Suite", kept: overrides.Override) -> str:
    config = suite.actor_config(kept.actor)
    if not kept.group or (not kept.words and config is not None and config.options.get("concurrency_key") is None):
        return "(all)"
    return kept.words or short(kept.group)
