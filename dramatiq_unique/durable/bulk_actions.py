"""Bulk actions: retry every dead job a selection matches, cancel every waiting job one matches.

Each is one ``UPDATE`` per job table and store, however many rows match (a
hundred thousand as well as one): the rows are never read into Python one by
one.  What each row goes through is what :func:`~dramatiq_unique.retry_job`
(:mod:`dramatiq_unique.durable.dead`) and :func:`~dramatiq_unique.cancel_job`
(:mod:`dramatiq_unique.durable.cancel`) do to one job, in the same statement:

**Retry** (``failed`` rows): a new attempt of the same job, the same row and
message id; a new ``revision`` (an older copy of its message is skipped), a new
fencing token (the attempt it failed in, were it alive after all, can no longer
record over the new one), due now, ``finished_at`` and ``parked_on`` cleared,
and Dramatiq's ``Retries`` count restarted (the marker's ``rb``, as
``retry_job`` writes it).  Its unique key, for a lock type that holds one while
the job waits, is taken again in the row; a row whose key another job of the app
holds, or that another dead job of the same key retried here takes (the newest
of them), is left ``failed`` and reported *blocked*, as ``retry_job`` raises
``DuplicateJob`` for it.  Unlike ``retry_job`` the rows are left ``pending``,
not published: the re-drive sends them, a page at a time, as it sends any due
``pending`` row (its next pass, or ``redrive --once``), so that a hundred
thousand publishes are never made inside one call.  For the same reason their
Redis queue locks, which only name a waiting job to Redis-side readers (the
row's hold decides), are not written; and a holder past its ``unique_window``
blocks the key here, where ``retry_job`` of that one job frees it.

**Cancel** (waiting rows: ``pending``, parked ones included, ``queued``,
``retrying``): ``cancelled``, ``finished_at`` set, a new revision (its message,
wherever it is, is skipped when it arrives), its key freed, taken out of its
lock or slot group and any reservation of it ended.  The Redis queue locks of the
keys freed are then released in batches (one round trip per thousand), where
the job's own token still holds them; a failure leaves them to their TTL.

Both act on this app's rows (and on rows written before rows had an app, as
:func:`~dramatiq_unique.durable.lookup.ours` counts them: a retried one is
adopted) of the actors this process declares with the job table it lives in
(:class:`~dramatiq_unique.durable.scope.Scope`); the rows that match of an actor
it does not declare are counted and left, as ``retry_job`` refuses them.  Rows
are taken by a conditional UPDATE, so a job that started, finished or was
retried meanwhile is not touched, and two bulk actions at once act on each row
once.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Optional

import dramatiq
import peewee as pw
import redis

from dramatiq_unique.durable import bulk_selection as rows
from dramatiq_unique.durable import lookup
from dramatiq_unique.durable.bulk_selection import CANCEL, RETRY, Outcome, Selection
from dramatiq_unique.durable.scope import Scope
from dramatiq_unique.redis import lua, scripts
from dramatiq_unique.redis.keys import LOCK_PREFIX
from dramatiq_unique.storage.models import WAITING, JobModel, JobStatus, utcnow

if TYPE_CHECKING:
    from dramatiq_unique.suite import Suite

logger = logging.getLogger(__name__)

PENDING, CANCELLED = JobStatus.PENDING.value, JobStatus.CANCELLED.value
#: Times a bulk retry's UPDATE is run again when a send took one of its keys between the statement's
#: look at the holders and its write (the unique index refused it: nothing was written).
MAX_ROUNDS = 5
#: Blocked jobs named in an outcome (the rest are counted).
MAX_NAMED = 10
#: Queue locks released per Redis round trip.
RELEASE_BATCH = 1_000


# -- counting (what a confirmation shows) ------------------------------------------------------


def preview(suite: "Suite", broker: Optional[dramatiq.Broker], action: str, sel: Selection) -> Outcome:
    """How many rows ``action`` would take now, and how many that match it would leave (their actor
    is not declared here); one COUNT per job table and store."""
    scope, outcome = Scope(suite, broker), Outcome(action, preview=True)

    def count(index: int, tables: list[type[JobModel]]) -> None:
        for model in tables:
            names = rows.declared(scope, model)
            mine = pw.Case(None, [(rows.of(model, names), 1)], 0)
            query = model.select(pw.fn.COUNT(model.id), pw.fn.SUM(mine)).where(rows.matching(suite, action, model, sel))
            row: Any = query.tuples().get()
            total, declared = row
            outcome.done += int(declared or 0)
            outcome.undeclared += int(total or 0) - int(declared or 0)

    _, down = lookup.each_store(suite, f"counting the jobs to {action}", count)
    outcome.down = [str(e) for e in down]
    return outcome


# -- retry ---------------------------------------------------------------------------------------


def retry_all(suite: "Suite", broker: Optional[dramatiq.Broker], sel: Selection) -> Outcome:
    """Retry the dead jobs ``sel`` matches (see the module docstring); one UPDATE per job table and store."""
    scope, outcome = Scope(suite, broker), Outcome(RETRY)

    def act(index: int, tables: list[type[JobModel]]) -> None:
        for model in tables:
            names = rows.declared(scope, model)
            matching = rows.matching(suite, RETRY, model, sel)
            if names:
                outcome.done += _retry(suite, model, names, sel)
                blocked = matching & rows.of(model, names)
                outcome.blocked += model.select().where(blocked).count()
                if len(outcome.blocked_by) < MAX_NAMED:
                    outcome.blocked_by += _blockers(suite, model, blocked, MAX_NAMED - len(outcome.blocked_by))
            outcome.undeclared += model.select().where(matching & ~rows.of(model, names)).count()

    _, down = lookup.each_store(suite, "retrying the dead set", act)
    outcome.down = [str(e) for e in down]
    logger.info("Bulk retry of %s: %d jobs made due again, %d blocked by a holder of their key, %d left "
                "(actor not declared here).", sel, outcome.done, outcome.blocked, outcome.undeclared)
    return outcome


def _retry(suite: "Suite", model: type[JobModel], names: tuple[str, ...], sel: Selection) -> int:
    def selected(table: Any) -> Any:
        return rows.matching(suite, RETRY, table, sel) & rows.of(table, names)

    holds = rows.holds(suite, model, model, names)
    holder, newer = model.alias("holder"), model.alias("newer")
    held = pw.fn.EXISTS(holder.select(pw.SQL("1")).where(
        (holder.app == suite.app) & (holder.unique_hold == model.unique_key) & (holder.id != model.id)))
    # Two dead jobs of one key: the newest takes it back, as a retry of each in turn would let only one.
    # The newer one's conditions sit in a CASE, which no index serves, so that the key's index is the
    # subquery's only way in whatever the statistics say: where they are stale (a dead set that grew
    # faster than the table is analyzed, as in an outage), the (app, status) index looks cheaper, and
    # was planned as a scan of the whole dead set per dead job.
    also = pw.Case(None, [(selected(newer) & (newer.id > model.id) & rows.holds(suite, model, newer, names), 1)], 0)
    taken = pw.fn.EXISTS(newer.select(pw.SQL("1")).where((newer.unique_key == model.unique_key) & (also == 1)))
    cond = selected(model) & ~(holds & (held | taken))
    fields = {
        model.status: PENDING,
        model.app: suite.app,  # a row written before rows had an app is adopted, as a re-drive pass adopts it
        model.revision: model.revision + 1,
        model.fencing_token: model.fencing_token + 1,
        model.process_after: utcnow(),
        model.enqueued_at: None,
        model.broker_ref: None,
        model.finished_at: None,
        model.parked_on: None,
        model.lease_until: None,
        model.checked_at: None,
        model.missing_since: None,
        model.unique_hold: pw.Case(None, [(holds, model.unique_key)], model.unique_hold),
        model.options: rows.restarted_count(model),
    }
    db = model._meta.database
    for _ in range(MAX_ROUNDS):
        try:
            with db.atomic():  # a savepoint in the caller's transaction: a clash undoes only this statement
                return int(model.update(fields).where(cond).execute())
        except pw.IntegrityError:
            continue  # a send took one of the keys meanwhile: the next round sees its holder
    raise pw.IntegrityError(f"retrying the dead set of {model._meta.table_name}: its keys kept changing hands")


def _blockers(suite: "Suite", model: type[JobModel], blocked: Any, most: int) -> list[tuple[int, Optional[int]]]:
    """The first ``most`` rows left failed, each with the job holding its key (None: none holds it, another
    dead job of the key was retried; or it failed meanwhile)."""
    left = list(model.select(model.id, model.unique_key).where(blocked).order_by(model.id.desc()).limit(most))
    keys = {row.unique_key for row in left if row.unique_key is not None}
    holders: dict[Any, int] = {}
    if keys:
        query = model.select(model.id, model.unique_hold).where(
            (model.app == suite.app) & model.unique_hold.in_(sorted(keys)))
        holders = {row.unique_hold: row.id for row in query}
    return [(row.id, holders.get(row.unique_key)) for row in left]


# -- cancel --------------------------------------------------------------------------------------


def cancel_all(suite: "Suite", broker: Optional[dramatiq.Broker], sel: Selection) -> Outcome:
    """Cancel the waiting jobs ``sel`` matches (see the module docstring); one UPDATE per job table and
    store, then their queue locks released in batches."""
    bad = [s for s in sel.statuses if s not in WAITING]
    if bad or not sel.statuses:
        raise ValueError(f"only waiting jobs can be cancelled ({', '.join(WAITING)}), not {', '.join(bad) or 'none'}")
    scope, outcome = Scope(suite, broker), Outcome(CANCEL)
    locks: list[tuple[str, str]] = []

    def act(index: int, tables: list[type[JobModel]]) -> None:
        for model in tables:
            names = rows.declared(scope, model)
            matching = rows.matching(suite, CANCEL, model, sel)
            if names:
                freed = _cancel(model, matching & rows.of(model, names))
                outcome.done += len(freed)
                locks.extend((suite.keys.queue_lock(key), token) for key, token in freed if key and token)
            outcome.undeclared += model.select().where(matching & ~rows.of(model, names)).count()

    _, down = lookup.each_store(suite, "cancelling waiting jobs", act)
    outcome.down = [str(e) for e in down]
    release_all(suite, locks)
    logger.info("Bulk cancel of %s: %d jobs cancelled, %d left (actor not declared here).", sel, outcome.done,
                outcome.undeclared)
    return outcome


def _cancel(model: type[JobModel], cond: Any) -> list[tuple[Optional[str], Optional[str]]]:
    """Cancel the rows under ``cond``; returns each one's (unique key, queue lock token)."""
    token = rows.queue_lock_token(model)
    fields = {
        model.status: CANCELLED,
        model.finished_at: utcnow(),
        model.revision: model.revision + 1,
        model.unique_hold: None,
        model.parked_on: None,
        model.lease_until: None,  # a deck's reservation of a parked row ends with it
        model.missing_since: None,
    }
    update = model.update(fields).where(cond).returning(model.unique_key, token)
    return [(key, qt) for key, qt in update.tuples().execute()]


def release_all(suite: "Suite", locks: list[tuple[str, str]]) -> None:
    """Release each ``(lock name, token)`` where the token still holds it, on every master, a batch of
    :data:`RELEASE_BATCH` per round trip; a master that fails leaves its locks to their TTL."""
    if not locks:
        return
    calls = [([f"{LOCK_PREFIX}:{name}"], [token]) for name, token in locks]
    for client in suite.masters:
        script = lua.register(client, "lock_release")
        try:
            for start in range(0, len(calls), RELEASE_BATCH):
                scripts.run_all(script, calls[start:start + RELEASE_BATCH])
        except (redis.RedisError, OSError) as e:
            logger.warning("Could not release the queue locks of %d cancelled jobs on a Redis master (%s); "
                           "they expire by themselves.", len(calls), e)
