"""The parking moves' statements: a job parked on a group, the group's next job claimed or
reserved for a deck, a reserved job started, and the moves undone.

Their SQL is in ``queries.sql`` (:mod:`dramatiq_unique.storage.queries`), rendered once
per model and prepared on PostgreSQL (:mod:`dramatiq_unique.storage.prepared`).  The
moves on the critical path of every hand-over commit without waiting for the WAL flush
(:func:`no_flush_wait` says why that is safe).
"""

from __future__ import annotations

import uuid
from typing import Any, Optional

from dramatiq_unique.storage import prepared, queries
from dramatiq_unique.storage.models import WAITING, JobModel, JobStatus, after_ms, is_postgres, utcnow
from dramatiq_unique.storage.statements import PARTIAL, to_model


def render(model: type[JobModel], name: str, **slots: queries.Slot) -> queries.Statement:
    """Query ``name``, committing without waiting for the WAL flush where that is safe (:func:`no_flush_wait`)."""
    if no_flush_wait(model._meta.database):
        return queries.render(model, "no_flush_wait", statement=name, **slots)
    return queries.render(model, name, **slots)


def no_flush_wait(db: Any) -> bool:
    """Whether a parking move on ``db`` may commit without waiting for the WAL flush: the
    ``no_flush_wait`` query of queries.sql, which wraps the move's statement.

    Only for the parking moves (park, claim, reserve), which sit on the
    critical path of every hand-over.  Safe because a later synchronous commit
    (the woken attempt's start, any job's outcome) flushes the WAL up to
    and past them; and if the server crashes first and loses one, the
    row is back where the re-drive looks: a lost park leaves a queued row
    whose message is gone (re-sent), a lost claim a parked row (woken).
    One statement, so one round trip, prepared as the other hot
    statements are.  Not inside the caller's own transaction, which must keep its
    own commit rules.
    """
    return is_postgres(db) and not db.in_transaction()


def db_now(db: Any) -> str:
    """The database's clock as an SQL expression in the job table's time format (naive UTC).

    Reservations (:mod:`dramatiq_unique.parking.deck`) are written and read by it, so one
    process's wall clock is never compared with a lease another process's clock wrote.
    SQLite's clock is the machine's: its processes share it.
    """
    return queries.BLOCKS[("now", queries.dialect_of(db))]  # no names, no parameters: as written


def _order(order_by: str) -> str:
    return "by_process_after" if order_by == "process_after" else "by_created_at"


def claim_parked(
    model: type[JobModel], group: str, order_by: str, now: Any, broker_ref: str,
    start: Optional[tuple[Any, str, bool]] = None, *, app: str,
) -> Optional[JobModel]:
    """Claim the next due job of ``app`` parked on ``group`` (status pending to queued) and return
    it; None if none.

    One statement: the head of the group is chosen and claimed together
    (on PostgreSQL skipping a head another waker has locked), so two
    wakers never claim one row.  ``broker_ref`` is the id the woken
    message is delivered under, recorded for the lost-message check.

    ``start`` (lease end, worker, release the unique hold): start the
    attempt in the same statement (see :mod:`dramatiq_unique.parking.prestart`),
    unless the row's own options name a unique option; the returned row
    says ``running`` when it was started.  A start waits for its commit;
    a plain claim does not (:func:`no_flush_wait`).
    """
    db = model._meta.database
    fields = model._meta.fields
    when = fields["enqueued_at"].db_value(now)
    values = {
        "queued": JobStatus.QUEUED.value, "now": when, "broker_ref": broker_ref, "app": app, "group": group,
        "pending": JobStatus.PENDING.value, "due": when,
    }
    if start is None:
        statement = render(model, "claim_parked", order=_order(order_by))
    else:
        lease_until, worker, release_hold = start
        values.update(running=JobStatus.RUNNING.value, started_at=when, worker=worker,
                      lease_until=fields["lease_until"].db_value(lease_until), release_hold=1 if release_hold else 0)
        # The start of start_attempt and start_reserved, on a row free of unique options of its own.
        statement = queries.render(model, "claim_and_start", order=_order(order_by), guard="unique_free",
                                   token="next_token")
    row = prepared.execute(db, statement.sql, statement.params(values)).fetchone()
    return None if row is None else to_model(model, row)


def park(model: type[JobModel], job_id: int, revision: int, group: str, options: dict, now: Any) -> Optional[tuple]:
    """Park a waiting job on ``group`` (status pending, ``parked_on`` set); returns its
    ``(created_at, process_after)`` (its place in the queue), or None if it is not waiting.

    A running row whose lease ran out counts as waiting: it is a crashed or
    stalled attempt of this very job, which is over.  Its fencing token moves on
    and its ``worker`` and lease go (queries.sql says why): should the attempt
    wake, nothing it writes lands on the parked row.
    """
    db = model._meta.database
    statement = render(model, "park")
    fields = model._meta.fields
    pending, queued, retrying = WAITING
    values = {
        "pending": pending, "queued": queued, "retrying": retrying, "group": group,
        "options": fields["options"].db_value(options), "id": job_id, "revision": revision,
        "running": JobStatus.RUNNING.value, "now": fields["lease_until"].db_value(now),
    }
    row = prepared.execute(db, statement.sql, statement.params(values)).fetchone()
    if row is None:
        return None
    return fields["created_at"].python_value(row[0]), fields["process_after"].python_value(row[1])


# -- reservations (parking/deck.py) ---------------------------------------------------
#
# A reservation's lease is written and read by the database's clock (the ``now`` queries),
# so processes whose clocks disagree agree on when it ends.  Safety does not rest on any
# clock: a reserved row is started by a compare-and-set on what its reservation read
# (start_reserved), which fails once anyone else has claimed, started, re-parked or replaced it.


#: The columns a reservation reads back: what the woken message and its attempt's start need;
#: current_job() reads the rest when asked (``statements.PARTIAL``).
DECK_COLUMNS = (
    "id", "message_id", "actor_name", "queue_name", "args", "kwargs", "options", "status", "revision",
    "attempts", "unique_key", "fencing_token", "checkpoints", "broker_ref", "created_at", "process_after",
)


def reserve(
    model: type[JobModel], group: str, order_by: str, marker: str, lease_ms: float, *, app: str,
) -> Optional[JobModel]:
    """Reserve the first due, unreserved row of ``app`` parked on ``group`` for the process
    ``marker`` names, for ``lease_ms`` (by the database's clock); None if there is none.  The
    reservation gets a fresh ``broker_ref``: the id its message will be delivered under, and
    its identity (any claim by another waker writes its own)."""
    db = model._meta.database
    statement = render(model, "reserve", order=_order(order_by))
    values = {
        "marker": marker, "lease_ms": float(lease_ms), "broker_ref": str(uuid.uuid4()), "app": app, "group": group,
        "pending": JobStatus.PENDING.value, "due": model._meta.fields["process_after"].db_value(utcnow()),
    }
    found = prepared.execute(db, statement.sql, statement.params(values)).fetchone()
    return None if found is None else to_model(model, found, DECK_COLUMNS)


def start_reserved(
    model: type[JobModel], row: JobModel, marker: str, worker: str, lease_ms: float,
) -> Optional[JobModel]:
    """Start a row this process reserved (``row`` as its reservation read it), before its
    message is delivered; returns the started row as the database now holds it, or None if
    it is no longer ours as reserved: replaced (revision), claimed or reserved by another
    process (status, ``worker``, ``broker_ref``), started by anyone (``fencing_token``).

    A compare-and-set that reads no clock, so a reservation that ran out while this process
    stalled, or that a process with a faster clock took early, is never started here.  The
    attempt's token is the row's next one, drawn in the same statement: no attempt gets it
    twice.  A synchronous commit (a lost start could hand its token out again).
    """
    statement = queries.render(model, "start_reserved", token="next_token")
    fields = model._meta.fields
    now = utcnow()
    lease_until = after_ms(lease_ms, now)
    values = {
        "running": JobStatus.RUNNING.value, "started_at": fields["started_at"].db_value(now),
        "lease_until": fields["lease_until"].db_value(lease_until), "worker": worker, "id": row.id,
        "pending": JobStatus.PENDING.value, "marker": marker, "revision": row.revision,
        "reserved_token": row.fencing_token, "broker_ref": row.broker_ref,
    }
    found = prepared.execute(model._meta.database, statement.sql, statement.params(values)).fetchone()
    if found is None:
        return None
    started = to_model(model, found, DECK_COLUMNS)
    started.__data__.update(started_at=now, lease_until=lease_until, worker=worker, parked_on=None)
    setattr(started, PARTIAL, True)
    return started


def unstart(model: type[JobModel], started: JobModel, group: str) -> bool:
    """Undo :func:`start_reserved` (or a claim's start) whose message was not delivered: the row
    is parked on ``group`` again, unreserved, its attempt not counted.  Its fencing token stays
    drawn (tokens never go back).  False if the attempt no longer owns the row."""
    return bool(
        model.update(
            status=JobStatus.PENDING.value, parked_on=group, attempts=model.attempts - 1, worker=None,
            lease_until=None,
        ).where(
            (model.id == started.id) & (model.status == JobStatus.RUNNING.value)
            & (model.fencing_token == started.fencing_token) & (model.worker == started.worker)
        ).execute()
    )


def unclaim(model: type[JobModel], row: JobModel, group: str) -> None:
    """Put a claimed row that was not delivered back in its group's queue.

    Not :func:`dramatiq_unique.storage.jobs.unclaim_sends`: a parked row's claim wrote the
    woken message's broker id before the delivery, so the row is recognised by having
    left its group (``parked_on`` cleared) rather than by a missing broker id, and it goes
    back to its group, not to the re-drive.
    """
    model.update(status=JobStatus.PENDING.value, parked_on=group).where(
        (model.id == row.id) & (model.status == JobStatus.QUEUED.value) & model.parked_on.is_null()
    ).execute()
