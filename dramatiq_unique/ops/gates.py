"""Who holds a lock or a slot group, and who waits for it: the facts behind the operator's views.

Redis knows the holders of a gate only by token (a lock's value, a slot
group's sorted set); the job tables know which job runs under which key.
So a holder's job is a ``running`` row of the key: for a lock, the row
whose ``unique_key`` it is (with the fencing token it drew); for a slot
group, the running rows of the actor whose arguments give the group's
key, and the jobs woken with one of its slots that still wait in the
broker for a worker thread (``queued``): those the gate notes by message
id (:meth:`~dramatiq_unique.slots.gate.SlotGate.note`).  Waiters are the
rows parked on the group (``parked_on``), in the order they start
(``unique_order_by``), read through the ``(app, parked_on, created_at)``
index, a bounded number at a time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional, Sequence

from dramatiq_unique import options as opt
from dramatiq_unique.slots.gate import group_key
from dramatiq_unique.storage.models import JobModel, JobStatus

if TYPE_CHECKING:
    from dramatiq_unique.suite import ActorConfig, Suite

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


def _order(config: Optional["ActorConfig"]) -> str:
    return (config.options.get("unique_order_by") if config else None) or opt.DEFAULT_UNIQUE_ORDER_BY


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
        query = table.select(table.id).where(cond).order_by(first, table.id).limit(NAMED_WAITERS)
        ids += [row.id for row in query]
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
    for table in tables(suite, actor):
        row = (
            table.select()
            .where((table.app == suite.app) & (table.unique_key == unique_key) & (table.status == RUNNING))
            .order_by(table.fencing_token.desc())
            .first()
        )
        if row is not None:
            return row
    return None


def queue_holder(suite: "Suite", actor: str, unique_key: str) -> Optional[JobModel]:
    """The row holding ``unique_key`` while it waits (the queue lock's job), or None."""
    for table in tables(suite, actor):
        row = table.select().where((table.app == suite.app) & (table.unique_hold == unique_key)).first()
        if row is not None:
            return row
    return None


def slot_holders(suite: "Suite", actor: str) -> dict[str, list[int]]:
    """{group key: ids of the running jobs in it} for ``actor``'s running rows (bounded)."""
    config = suite.actor_config(actor)
    holders: dict[str, list[int]] = {}
    if config is None:
        return holders
    table = config.model
    # No ORDER BY: SQLite would then walk the primary key (a million finished rows) to avoid a
    # sort, rather than take the few running rows by the (app, status, ...) index (measured: 120 ms).
    query = (
        table.select()
        .where((table.app == suite.app) & (table.status == RUNNING) & (table.actor_name == actor))
        .limit(MAX_RUNNING)
    )
    for row in sorted(query, key=lambda r: r.id):
        try:
            key = group_key(config, row.options or {}, tuple(row.args or ()), dict(row.kwargs or {}))
        except Exception:  # arguments that no longer bind: not placed in a group
            continue
        holders.setdefault(key, []).append(row.id)
    return holders


def woken_holders(suite: "Suite", actor: str, message_ids: Sequence[str]) -> list[JobModel]:
    """The rows of ``message_ids`` (jobs the slot gate noted as handed a slot while they wait in the
    broker) that still wait so (``queued``); a running one is found as such, any other holds nothing."""
    found: list[JobModel] = []
    if not message_ids:
        return found
    for table in tables(suite, actor):
        query = table.select().where(
            (table.app == suite.app) & table.message_id.in_(list(message_ids)[:MAX_RUNNING])
            & (table.status == QUEUED)
        )
        found += list(query)
    return sorted(found, key=lambda row: row.id)


def one_row(suite: "Suite", actor: str, group: str) -> Optional[JobModel]:
    """A row parked on ``group``, to render its key from (None if none waits)."""
    for table in tables(suite, actor):
        row = table.select().where(_parked(suite, table, group)).first()
        if row is not None:
            return row
    return None
