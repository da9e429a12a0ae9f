"""The re-drive's queries and claims, and the message it rebuilds from a row.

Every query here starts from an index that excludes finished rows
(``(app, status, process_after)``, ``(app, status, lease_until)``,
``(app, finished_at)``; a pass adds its app and actors, scope.py), so a
pass costs the same beside a million finished rows, or another app's
backlog, as beside none;
:func:`pass_queries` lists them for ``EXPLAIN`` (the benchmark prints
their plans, a test checks them).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Callable, Optional

import peewee as pw
from dramatiq import Message

from dramatiq_unique.context import MARKER
from dramatiq_unique.durable.messages import epoch_ms, rebuild
from dramatiq_unique.storage.database import is_postgres
from dramatiq_unique.storage.models import FINISHED, JobModel, JobStatus, after_ms, utcnow

PENDING, QUEUED, RUNNING = JobStatus.PENDING.value, JobStatus.QUEUED.value, JobStatus.RUNNING.value
RETRYING, FAILED = JobStatus.RETRYING.value, JobStatus.FAILED.value
#: The job marker's entry holding the attempts a failed job had when retry_job sent it again
#: (durable/dead.py): Retries counts only the failed attempts after it.
RETRY_BASE = "rb"


def due(model: type[JobModel], status: str, now: datetime) -> Any:
    """Jobs to send: due ``pending`` ones not parked, ``retrying`` ones whose retry never reached the broker."""
    cond = (model.status == status) & (model.process_after <= now) & model.parked_on.is_null()
    if status == RETRYING:
        cond &= model.enqueued_at.is_null()
    return cond


def due_query(model: type[JobModel], cond: Any, page: int) -> pw.Select:
    # process_after alone: the index gives that order, so LIMIT stops early (no sort of the backlog).
    return model.select(model.id).where(cond).order_by(model.process_after).limit(page)


def suspects(
    model: type[JobModel], cutoff: datetime, marked_before: datetime, *, can_probe: bool
) -> list[tuple[str, Any, Any]]:
    """(status, condition, order) of jobs overdue by ``lost_after`` whose message the pass looks for.

    ``cutoff`` is now minus ``lost_after``.  A row checked since ``cutoff``
    waits: each job is looked up at most once per ``lost_after``.  A row
    marked missing after ``marked_before`` waits for a later pass to confirm.
    """
    fresh = model.checked_at.is_null() | (model.checked_at <= cutoff)
    unmarked = model.missing_since.is_null() | (model.missing_since <= marked_before)
    groups = [(RUNNING, (model.status == RUNNING) & (model.lease_until <= cutoff), model.lease_until)]
    for status in (QUEUED, RETRYING):
        cond = (model.status == status) & (model.process_after <= cutoff) & (model.enqueued_at <= cutoff)
        if not can_probe:
            # The broker cannot be asked: trust it with what it took (broker_ref set
            # after the publish); a claim whose publish never happened has none.
            cond &= model.broker_ref.is_null()
        groups.append((status, cond, model.process_after))
    return [(status, cond & fresh & unmarked, order) for status, cond, order in groups]


def suspect_query(model: type[JobModel], cond: Any, order: Any, page: int) -> pw.Select:
    return model.select().where(cond).order_by(order).limit(page)


def prune_query(model: type[JobModel], cutoff: datetime, page: int) -> pw.Select:
    return model.select(model.id).where((model.finished_at < cutoff) & model.status.in_(FINISHED)).limit(page)


def prune(
    model: type[JobModel], scope: Any, settings: Any, *, page: int, max_pages: int,
    after_page: Callable[[], None] = lambda: None,
) -> int:
    """Delete ``model``'s finished rows (of ``scope``, a :meth:`Scope.where` condition) past the
    ``retention`` setting, page by page, calling ``after_page`` after each; returns how many."""
    # Rows hold idempotency keys for their window: keep them at least that long.
    cutoff = after_ms(-max(settings.retention, settings.idempotency_window))
    pruned = 0
    for _ in range(max_pages):
        ids = [row_id for (row_id,) in prune_query(model, cutoff, page).where(scope).tuples()]
        if ids:
            pruned += model.delete().where(model.id.in_(ids)).execute()
            after_page()
        if len(ids) < page:
            break
    return pruned


def pass_queries(
    model: type[JobModel], *, lost_after: float, retention: float, page: int = 500, can_probe: bool = True,
    scope: Any = None,
) -> dict[str, pw.Select]:
    """The SELECTs a pass runs on ``model``, by name, as of now; ``scope``: the condition
    that keeps them to one app's rows of its declared actors (:meth:`Scope.where`)."""
    now = utcnow()
    cutoff = after_ms(-lost_after, now)
    scoped = (lambda cond: cond & scope) if scope is not None else (lambda cond: cond)  # noqa: E731
    queries = {
        f"due {status}": due_query(model, scoped(due(model, status, now)), page) for status in (PENDING, RETRYING)
    }
    for status, cond, order in suspects(model, cutoff, now, can_probe=can_probe):
        queries[f"lost {status}"] = suspect_query(model, scoped(cond), order, page)
    prune = prune_query(model, after_ms(-retention, now), page)
    queries["prune"] = prune.where(scope) if scope is not None else prune
    return queries


def claim_fields(model: type[JobModel], **extra: Any) -> dict:
    """The UPDATE that takes a row for sending: queued, a new revision, no broker id yet."""
    fields = {
        model.status: QUEUED,
        model.enqueued_at: utcnow(),
        model.revision: model.revision + 1,
        model.broker_ref: None,
        model.checked_at: None,
        model.missing_since: None,
        model.lease_until: None,
    }
    fields.update({getattr(model, name): value for name, value in extra.items()})
    return fields


def claim_page(model: type[JobModel], cond: Any, page: int) -> list[JobModel]:
    """Claim up to ``page`` rows matching ``cond``; returns them as claimed."""
    db = model._meta.database
    with db.atomic():
        query = due_query(model, cond, page)
        if is_postgres(db):
            query = query.for_update(skip_locked=True)
        ids = [row_id for (row_id,) in query.tuples()]
        if not ids:
            return []
        # The condition again: a row another pass claimed meanwhile no longer matches.
        update = model.update(claim_fields(model)).where(model.id.in_(ids) & cond)
        return list(update.returning(*sending_fields(model)).execute())


def sending_fields(model: type[JobModel]) -> list[pw.Field]:
    """The columns that sending a claimed row needs (not the whole, wide row)."""
    names = ("id", "message_id", "actor_name", "queue_name", "args", "kwargs", "options", "revision",
             "attempts", "created_at", "process_after", "status")
    return [model._meta.fields[name] for name in names]


def unchanged(model: type[JobModel], row: JobModel) -> Any:
    """The row is still as it was read: nobody started, finished, renewed or re-sent it since."""
    cond = (
        (model.id == row.id)
        & (model.status == row.status)
        & (model.revision == row.revision)
        & (model.fencing_token == row.fencing_token)
    )
    cond &= model.broker_ref.is_null() if row.broker_ref is None else (model.broker_ref == row.broker_ref)
    if row.lease_until is not None:
        cond &= model.lease_until == row.lease_until  # a heartbeat renewed it: alive
    return cond


def claim_one(model: type[JobModel], row: JobModel, **extra: Any) -> Optional[JobModel]:
    update = model.update(claim_fields(model, **extra)).where(unchanged(model, row))
    claimed = list(update.returning(*sending_fields(model)).execute())
    return claimed[0] if claimed else None


def build_message(row: JobModel) -> Message:
    """The job's message, rebuilt from its row, marked as the row's current revision."""
    message = rebuild(row, timestamp=epoch_ms(row.created_at))
    if row.attempts:
        # Retries counts failed attempts in the message; every attempt so far failed.
        message.options["retries"] = retries_so_far(row)
    return message


def retries_so_far(row: JobModel) -> int:
    """The failed attempts Dramatiq's Retries counts for the job: all of them, or those since
    :func:`dramatiq_unique.retry_job` last sent it again (a manual retry starts a new count)."""
    base = ((row.options or {}).get(MARKER) or {}).get(RETRY_BASE, 0)
    return max(row.attempts - int(base), 0)
