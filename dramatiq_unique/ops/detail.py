"""One job, as ``job ID`` shows it: the row, its attempts, while it waits why, and the slot it holds."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Optional, Union

from dramatiq_unique.durable import lookup
from dramatiq_unique.errors import DependencyUnavailable, JobNotFound
from dramatiq_unique.guard import guarded
from dramatiq_unique.ops import held
from dramatiq_unique.ops.listing import job_row
from dramatiq_unique.ops.views import Attempt, JobView, Waiting
from dramatiq_unique.ops.words import holding, why
from dramatiq_unique.parking.groups import LOCK, SLOT, actor_of, kind_of, slot_group, slot_key_of, unique_key_of
from dramatiq_unique.slots.gate import gate_of
from dramatiq_unique.storage.models import FINISHED, JobModel, JobStatus, utcnow
from dramatiq_unique.suite import Suite

#: Characters of a message id or id accepted (a longer "id" is garbage, not a lookup).
MAX_ID = 64
PENDING, QUEUED, RUNNING, RETRYING = (s.value for s in (JobStatus.PENDING, JobStatus.QUEUED, JobStatus.RUNNING,
                                                        JobStatus.RETRYING))


def job(suite: "Suite", id_or_message_id: Union[int, str]) -> JobView:
    """The view of the job by id (the primary's shared table) or message id (any table, any store);
    JobNotFound if this app has none, ValueError for what cannot be an id."""
    ref = str(id_or_message_id).strip()
    if not ref or len(ref) > MAX_ID or not ref.isprintable():
        raise ValueError(f"not a job id or message id: {str(id_or_message_id)[:MAX_ID]!r}")
    key: Union[int, str] = int(ref) if ref.isdigit() else ref
    row = None if isinstance(key, int) and key > lookup.MAX_JOB_ID else lookup.find_job(suite, key)
    if row is None:
        raise JobNotFound(repr(ref))
    with guarded(f"reading why job {row.id} waits"):
        waiting, slot = waiting_of(suite, row), slot_of(suite, row)
    if slot is not None and row.status == QUEUED and waiting is not None and waiting.reason == "queued":
        waiting = Waiting(reason="woken", label=slot[1], since=row.enqueued_at or row.created_at)
    return JobView(**vars(job_row(suite, row, suite.stores.index_of(type(row)))), args=row.args, kwargs=row.kwargs,
                   enqueued_at=row.enqueued_at, process_after=row.process_after, last_error=row.last_error,
                   result=row.result, fencing_token=row.fencing_token, checkpoints=row.checkpoints, worker=row.worker,
                   parked_on=row.parked_on, history=history(row), waiting=waiting, why=why(waiting, utcnow()),
                   slot=slot[0] if slot is not None else "")


def history(row: JobModel) -> list[Attempt]:
    """The row's attempts: its ``history`` column when it holds any, else the last attempt."""
    if isinstance(row.history, list) and row.history:
        return [Attempt(attempt=int(item.get("attempt") or i + 1), started_at=moment(item.get("started_at")),
                        finished_at=moment(item.get("finished_at")), status=item.get("status"),
                        error=item.get("error"), worker=item.get("worker"))
                for i, item in enumerate(row.history) if isinstance(item, dict)]
    if not row.attempts and row.started_at is None:
        return []
    status = str(row.status)
    return [Attempt(attempt=row.attempts or 1, started_at=row.started_at, finished_at=row.finished_at,
                    status=status if status in FINISHED or status == RUNNING else "failed", error=row.last_error,
                    worker=row.worker)]


def moment(value: Any) -> Optional[datetime]:
    """A time of the ``history`` column (JSON: ISO text) as a datetime; None if it is none."""
    if isinstance(value, str):
        try:
            return datetime.fromisoformat(value)
        except ValueError:
            return None
    return value if isinstance(value, datetime) else None


def waiting_of(suite: "Suite", row: JobModel) -> Optional[Waiting]:
    """Why ``row`` waits, as facts; None when it does not wait."""
    status, now = str(row.status), utcnow()
    due_in = (row.process_after - now).total_seconds() * 1000 if row.process_after else None
    if status == PENDING and row.parked_on:
        try:
            return _parked(suite, row)
        except DependencyUnavailable as e:
            return Waiting(reason=kind_of(row.parked_on), label=row.actor_name, note=f"not all known: {e}")
    if status == RETRYING:
        return Waiting(reason="retrying", due_in_ms=due_in)
    if status in (PENDING, QUEUED) and due_in is not None and due_in > 0:
        return Waiting(reason="due", due_in_ms=due_in)
    if status == QUEUED:
        return Waiting(reason="queued", since=row.enqueued_at or row.created_at)
    if status == PENDING:
        return Waiting(reason="pending", since=row.created_at)
    return None


def slot_of(suite: "Suite", row: JobModel) -> Optional[tuple[str, str]]:
    """The slot ``row``'s job holds, as (its line, the group in words); None if it holds none (or a
    store or Redis did not answer): a running job of an actor with slots, or a queued one the gate
    noted as woken with it."""
    status = str(row.status)
    config = suite.actor_config(row.actor_name)
    if status not in (RUNNING, QUEUED) or config is None or not config.for_message(row.options or {}).has_slots:
        return None
    key = held.group_of(config, row)
    if key is None:
        return None
    try:
        found = gate_of(suite).status(slot_group(key))
    except DependencyUnavailable:
        return None
    holders, queued = held.group_holders(suite, row.actor_name, key, found)
    if status == QUEUED and row.id not in queued:
        return None
    label = held.label(config, row.actor_name, "concurrency_key", row, key)
    return holding(label, found.held, None if found.limit < 0 else found.limit, holders), label


def _parked(suite: "Suite", row: JobModel) -> Waiting:
    group = row.parked_on or ""
    actor, config = actor_of(group), suite.actor_config(row.actor_name)
    ahead = held.ahead_of(suite, row)
    more, ahead = ahead > held.MAX_COUNTED, min(ahead, held.MAX_COUNTED)
    if kind_of(group) == LOCK:
        unique_key = unique_key_of(group)
        holder = held.lock_holder(suite, actor, unique_key)
        left = suite.locks.pttl(suite.keys.execution_lock(unique_key))
        return Waiting(reason="lock", label=held.label(config, actor, "unique_args", row, unique_key),
                       holders=[holder.id] if holder else [], held=1 if left > 0 else 0,
                       token=holder.fencing_token if holder else None, left_ms=left, ahead=ahead, ahead_more=more)
    if kind_of(group) == SLOT:
        key = slot_key_of(group)
        found = gate_of(suite).status(group)
        ids, _ = held.group_holders(suite, actor, key, found)
        return Waiting(reason="halted" if found.limit == 0 else "slot",
                       label=held.label(config, actor, "concurrency_key", row, key),
                       limit=None if found.limit < 0 else found.limit, holders=ids if found.held else [],
                       held=found.held, ahead=ahead, ahead_more=more)
    return Waiting(reason="pending", label=group, since=row.created_at, ahead=ahead, ahead_more=more)
