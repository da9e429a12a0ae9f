"""The parking moves' statements: a job parked on a group, the group's next job claimed.

Compiled once per model like :mod:`dramatiq_unique.storage.statements`'s, and prepared on
PostgreSQL (:mod:`dramatiq_unique.storage.prepared`).  The moves on the critical
path of every hand-over commit without waiting for the WAL flush
(:func:`no_flush_wait` says why that is safe).
"""

from __future__ import annotations

from typing import Any, Optional

from dramatiq_unique.storage import prepared
from dramatiq_unique.storage.models import WAITING, JobModel, JobStatus, is_postgres
from dramatiq_unique.storage.statements import _compiled, _dialect, _names, _quoter, to_model


def no_flush_wait(db: Any) -> str:
    """A prefix that lets a PostgreSQL statement commit without waiting for the WAL flush.

    Only for the parking moves (park, claim), which sit on the critical
    path of every hand-over.  Safe because a later synchronous commit
    (the woken attempt's start, any job's outcome) flushes the WAL up to
    and past them; and if the server crashes first and loses one, the
    row is back where the re-drive looks: a lost park leaves a queued row
    whose message is gone (re-sent), a lost claim a parked row (woken).
    Sent as one query string with the statement, it is one implicit
    transaction in autocommit: one round trip.  Not inside the caller's
    own transaction, which must keep its own commit rules.
    """
    if is_postgres(db) and not db.in_transaction():
        return prepared.NO_FLUSH_WAIT
    return ""


def db_now(db: Any, plus_ms: Optional[str] = None) -> str:
    """The database's clock as an SQL expression in the job table's time format (naive UTC),
    ``plus_ms`` (a placeholder: ms) later if given.

    Reservations (:mod:`dramatiq_unique.parking.deck`) are written and read by it, so one
    process's wall clock is never compared with a lease another process's clock wrote.
    SQLite's clock is the machine's: its processes share it.
    """
    if is_postgres(db):
        now = "(statement_timestamp() AT TIME ZONE 'UTC')"
        return now if plus_ms is None else f"({now} + CAST({plus_ms} AS double precision) * INTERVAL '1 millisecond')"
    if plus_ms is None:
        return "strftime('%Y-%m-%d %H:%M:%f', 'now')"
    return f"strftime('%Y-%m-%d %H:%M:%f', 'now', '+' || (CAST({plus_ms} AS REAL) / 1000.0) || ' seconds')"


def queue_head(model: type[JobModel], order_by: str, limit: str = "1") -> str:
    """The SELECT of a group's next due, unreserved parked rows of one app, in serving order.

    Parameters, in order: app, group, ``pending``, now (due time); then the
    limit if it is a placeholder.  The app, because apps that share the table
    share group names (an actor of the same name, the same key): a row of
    another app is never its job to wake (guarantee 7; the index is
    ``(app, parked_on, created_at)``).  Reservations (see :mod:`dramatiq_unique.parking.deck`) are
    judged by the database's clock (:func:`db_now`).  The one definition of
    "next" for claims and reservations.
    """
    table, _, p = _names(model)
    q = _quoter(model)
    order = q("process_after") if order_by == "process_after" else q("created_at")
    return (
        f"SELECT {q('id')} FROM {table} WHERE {q('app')} = {p} AND {q('parked_on')} = {p} AND {q('status')} = {p} "
        f"AND ({q('lease_until')} IS NULL OR {q('lease_until')} <= {db_now(model._meta.database)}) "
        f"AND ({q('process_after')} IS NULL OR {q('process_after')} <= {p}) "
        f"ORDER BY {order}, {q('id')} LIMIT {limit}"
    )


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
    a plain claim does not (``_no_flush_wait``).
    """
    db = model._meta.database
    prefix = "" if start is not None else no_flush_wait(db)

    def build() -> str:
        table, columns, p = _names(model)
        q = _quoter(model)
        waiting = f"{q('parked_on')} = {p} AND {q('status')} = {p}"
        if start is None:
            sets = f"SET {q('status')} = {p}, "
        else:
            find = "strpos" if is_postgres(db) else "instr"
            own = f"COALESCE({find}({q('options')}, '\"unique_'), 0) = 0"  # no unique option of its own
            sets = (
                f"SET {q('status')} = CASE WHEN {own} THEN {p} ELSE {p} END, "
                f"{q('attempts')} = {q('attempts')} + CASE WHEN {own} THEN 1 ELSE 0 END, "
                f"{q('started_at')} = CASE WHEN {own} THEN {p} ELSE {q('started_at')} END, "
                f"{q('lease_until')} = CASE WHEN {own} THEN {p} ELSE {q('lease_until')} END, "
                f"{q('worker')} = CASE WHEN {own} THEN {p} ELSE {q('worker')} END, "
                f"{q('fencing_token')} = {q('fencing_token')} + CASE WHEN {own} THEN 1 ELSE 0 END, "
                f"{q('unique_hold')} = CASE WHEN {own} AND {p} = 1 THEN NULL ELSE {q('unique_hold')} END, "
            )
        sets += f"{q('parked_on')} = NULL, {q('enqueued_at')} = {p}, {q('broker_ref')} = {p}, {q('missing_since')} = NULL "
        head = queue_head(model, order_by)
        if is_postgres(db):
            # A join on the locked head, so the update finds its row by primary key (with
            # ``id = (subquery)`` the planner may scan the status index for it instead).
            return (
                f"{prefix}UPDATE {table} {sets}FROM ({head} FOR UPDATE SKIP LOCKED) AS head "
                f"WHERE {table}.{q('id')} = head.{q('id')} "
                f"RETURNING {', '.join(f'{table}.{q(c)}' for c in columns)}"
            )
        # SQLite: no row locks; the head is checked again as it is updated.
        return (
            f"UPDATE {table} {sets}WHERE {q('id')} = ({head}) AND {waiting} "
            f"RETURNING {', '.join(q(c) for c in columns)}"
        )

    sql = _compiled(("claim_parked", model, order_by, prefix, start is not None, _dialect(model)), build)
    fields = model._meta.fields
    when = fields["enqueued_at"].db_value(now)
    pending, queued = JobStatus.PENDING.value, JobStatus.QUEUED.value
    if start is None:
        params: list[Any] = [queued]
    else:
        lease_until, worker, release_hold = start
        params = [
            JobStatus.RUNNING.value, queued, when, fields["lease_until"].db_value(lease_until), worker,
            1 if release_hold else 0,
        ]
    params += [when, broker_ref, app, group, pending, when]
    if not is_postgres(db):
        params += [group, pending]
    row = prepared.execute(db, sql, params).fetchone()
    return None if row is None else to_model(model, row)


def park(model: type[JobModel], job_id: int, revision: int, group: str, options: dict, now: Any) -> Optional[tuple]:
    """Park a waiting job on ``group`` (status pending, ``parked_on`` set); returns its
    ``(created_at, process_after)`` (its place in the queue), or None if it is not waiting.

    A running row whose lease ran out counts as waiting: it is a crashed
    attempt of this very job.
    """
    db = model._meta.database

    def build() -> str:
        table, _, p = _names(model)
        q = _quoter(model)
        return (
            f"{no_flush_wait(db)}UPDATE {table} SET {q('status')} = {p}, {q('parked_on')} = {p}, {q('options')} = {p} "
            f"WHERE {q('id')} = {p} AND {q('revision')} = {p} AND ({q('status')} IN ({p}, {p}, {p}) "
            f"OR ({q('status')} = {p} AND {q('lease_until')} < {p})) RETURNING {q('created_at')}, {q('process_after')}"
        )

    sql = _compiled(("park", model, no_flush_wait(db), _dialect(model)), build)
    fields = model._meta.fields
    params = [
        JobStatus.PENDING.value, group, fields["options"].db_value(options), job_id, revision,
        *WAITING, JobStatus.RUNNING.value, fields["lease_until"].db_value(now),
    ]
    row = prepared.execute(db, sql, params).fetchone()
    return None if row is None else (fields["created_at"].python_value(row[0]), fields["process_after"].python_value(row[1]))
