"""The rows of parked jobs: what parking and the deck ask of the job table.

A row is parked when ``status = "pending"`` and ``parked_on`` names its
group (:mod:`dramatiq_unique.parking.lot`).  A parked row may be *reserved* by
a worker process for its deck (:mod:`dramatiq_unique.parking.deck`): ``worker``
then reads ``<host>:<pid>:deck`` and ``lease_until`` says when the
reservation ends; other wakers skip it until then.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable, Optional

import peewee as pw

from dramatiq_unique.context import MARKER
from dramatiq_unique.parking.groups import LOCK, SLOT
from dramatiq_unique.storage import jobs
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
    clock = pw.SQL(jobs.db_now(model._meta.database))  # reservations run by the database's clock
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


def job_row(config: "ActorConfig", message: Any, unique_key: Optional[str] = None) -> tuple[int, int]:
    """The message's job row id and revision; a message sent without the suite gets a row."""
    marker = message.options.get(MARKER) or {}
    if "id" in marker:
        return int(marker["id"]), int(marker.get("rev", 0))
    fields = row_fields(config, message, None)
    fields["unique_key"] = unique_key
    # Revision 0 even of a row an earlier delivery made: the message is that row's first
    # revision (JobTracking._adopt, after a job_row, finds the marker and adopts nothing).
    job_id, _, _ = jobs.adopt(config.model, fields)
    message.options[MARKER] = {**marker, "id": job_id, "rev": 0}
    return int(job_id), 0


# -- reservations (deck.py) ----------------------------------------------------------
#
# A reservation's lease is written and read by the database's clock
# (jobs.db_now), so processes whose clocks disagree agree on when it ends.
# Safety does not rest on any clock: a reserved row is started by a compare-and-set
# on what its reservation read (jobs.start_reserved), which fails once anyone else has
# claimed, started, re-parked or replaced it.


def reserve_many(info: "GroupInfo", group: str, marker: str, count: int, *, app: str) -> list[JobModel]:
    """Up to ``count`` rows reserved (:func:`~dramatiq_unique.storage.jobs.reserve`),
    each for the group's slot lease."""
    rows: list[JobModel] = []
    for _ in range(count):
        found = jobs.reserve(info.model, group, info.order_by, marker, info.ttl_ms, app=app)
        if found is None:
            break
        rows.append(found)
    return rows


def parked_counts(
    models: Iterable[type[JobModel]], app: str, actors: Iterable["ActorConfig"] = ()
) -> dict[tuple[str, str], int]:
    """The jobs of ``app`` parked now, by (actor, gate kind): for the parked-jobs gauge.
    One query per table, on the (app, parked_on) index.  Every actor of ``actors`` that may
    park reads 0 when none is: the gauge keeps each process's last count, and a group that
    emptied must not keep the count another process saw."""
    counts: dict[tuple[str, str], int] = {}
    for config in actors:
        if config.options.get("unique_args") is not None:
            counts[(config.actor_name, LOCK)] = 0
        if config.options.get("concurrency_limit") is not None or config.options.get("concurrency_key") is not None:
            counts[(config.actor_name, SLOT)] = 0
    for model in models:
        kind = pw.Case(None, [(model.parked_on.startswith(f"{SLOT}:"), SLOT)], LOCK)
        query = model.select(model.actor_name, kind, pw.fn.COUNT(model.id)).where(
            (model.app == app) & model.parked_on.is_null(False) & (model.status == JobStatus.PENDING.value)
        ).group_by(model.actor_name, pw.SQL("2"))  # by position: psycopg 3 binds the CASE's values anew there
        row: Any
        for row in query.tuples():  # tuples, which peewee's hints call models
            actor, gate, count = row
            counts[(actor, gate)] = counts.get((actor, gate), 0) + int(count)
    return counts
