"""The rows of parked jobs: what parking and the deck ask of the job table.

A row is parked when ``status = "pending"`` and ``parked_on`` names its
group (:mod:`dramatiq_unique.parking.lot`).  A parked row may be *reserved* by
a worker process for its deck (:mod:`dramatiq_unique.parking.deck`): ``worker``
then reads ``<host>:<pid>:deck`` and ``lease_until`` says when the
reservation ends; other wakers skip it until then.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

import peewee as pw

from dramatiq_unique.context import MARKER
from dramatiq_unique.storage import jobs, parking_statements
from dramatiq_unique.storage.models import JobModel, JobStatus, utcnow
from dramatiq_unique.unique.enqueue import row_fields

if TYPE_CHECKING:
    from dramatiq_unique.parking.gates import GroupInfo
    from dramatiq_unique.suite import ActorConfig


def waiting_in(info: "GroupInfo", group: str, *, app: str) -> Optional[float]:
    """ms until a row of ``app`` parked on ``group`` may be claimed: 0 if one may be now, else
    until the first reservation runs out (:mod:`~dramatiq_unique.parking.deck`); None if none waits.

    One query, one clock: asked as two ("any due?", then "reserved until?"), a reservation
    that ran out between them looked neither due nor reserved, and its row was stranded.
    """
    model, now = info.model, utcnow()
    clock = pw.SQL(parking_statements.db_now(model._meta.database))  # reservations run by the database's clock
    free = model.lease_until.is_null() | (model.lease_until <= clock)
    row: Any = model.select(  # a tuple (.tuples()), which peewee's hints call a model
        pw.fn.COUNT(pw.Case(None, [(free, 1)], None)), pw.fn.MIN(pw.Case(None, [(free, None)], model.lease_until)),
        clock,
    ).where(
        (model.app == app) & (model.parked_on == group) & (model.status == JobStatus.PENDING.value)
        & (model.process_after.is_null() | (model.process_after <= now))
    ).tuples().get()
    free_rows, until, db_time = row
    if free_rows:
        return 0.0
    if until is None:
        return None
    # SQLite hands back text for an aggregate and for its clock.
    until, db_time = (model.lease_until.python_value(v) if isinstance(v, str) else v for v in (until, db_time))
    return max((until - db_time).total_seconds() * 1000, 0)


def unclaim(model: type[JobModel], row: JobModel, group: str) -> None:
    """Put a claimed row that was not delivered back in its group's queue."""
    parking_statements.unclaim(model, row, group)


def job_row(config: "ActorConfig", message: Any, unique_key: Optional[str] = None) -> tuple[int, int]:
    """The message's job row id and revision; a message sent without the suite gets a row."""
    marker = message.options.get(MARKER) or {}
    if "id" in marker:
        return int(marker["id"]), int(marker.get("rev", 0))
    fields = row_fields(config, message, None)
    fields["unique_key"] = unique_key
    # Revision 0 even of a row an earlier delivery made: the message is that row's first
    # revision (JobTracking._adopt, after a job_row, finds the marker and adopts nothing).
    job_id, _ = jobs.adopt(config.model, fields)
    message.options[MARKER] = {**marker, "id": job_id, "rev": 0}
    return int(job_id), 0


# -- reservations (deck.py) ----------------------------------------------------------
#
# A reservation's lease is written and read by the database's clock
# (parking_statements.db_now), so processes whose clocks disagree agree on when it ends.
# Safety does not rest on any clock: a reserved row is started by a compare-and-set
# on what its reservation read (start_reserved), which fails once anyone else has
# claimed, started, re-parked or replaced it.


def reserve(info: "GroupInfo", group: str, marker: str, lease_ms: float, *, app: str) -> Optional[JobModel]:
    """Reserve the first due, unreserved row of ``app`` parked on ``group`` for this process, for
    ``lease_ms`` (by the database's clock); None if there is none.  The reservation gets a
    fresh ``broker_ref``: the id its message will be delivered under, and its identity
    (any claim by another waker writes its own)."""
    return parking_statements.reserve(info.model, group, info.order_by, marker, lease_ms, app=app)


def reserve_many(info: "GroupInfo", group: str, marker: str, count: int, *, app: str) -> list[JobModel]:
    """Up to ``count`` rows reserved with :func:`reserve`, for the group's slot lease."""
    rows: list[JobModel] = []
    for _ in range(count):
        found = reserve(info, group, marker, info.ttl_ms, app=app)
        if found is None:
            break
        rows.append(found)
    return rows


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
    return parking_statements.start_reserved(model, row, marker, worker, lease_ms)


def unstart(model: type[JobModel], started: JobModel, group: str) -> bool:
    """Undo :func:`start_reserved` (or a claim's start) whose message was not delivered: the row
    is parked on ``group`` again, unreserved, its attempt not counted.  Its fencing token stays
    drawn (tokens never go back).  False if the attempt no longer owns the row."""
    return parking_statements.unstart(model, started, group)
