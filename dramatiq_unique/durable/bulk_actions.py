"""Bulk actions: retry every dead job a selection matches, cancel every waiting job one matches.

One ``UPDATE`` per job table and store, in SQL, so that no row is read into Python; a row goes through
what ``retry_job`` or ``cancel_job`` does, except that retried rows are left ``pending`` for the re-drive.
See docs/howto/dead-set.md.
"""

from __future__ import annotations

import dataclasses
import logging
from datetime import datetime
from typing import TYPE_CHECKING, Any, Callable, Optional, cast

import dramatiq
import peewee as pw
import redis

from dramatiq_unique import options as opt
from dramatiq_unique.durable import lookup
from dramatiq_unique.durable.redrive import claim_fields
from dramatiq_unique.durable.scope import NO_APP, Scope
from dramatiq_unique.redis import lua, scripts
from dramatiq_unique.redis.keys import LOCK_PREFIX
from dramatiq_unique.storage import jobs, queries
from dramatiq_unique.storage.models import WAITING, JobModel, JobStatus, utcnow

if TYPE_CHECKING:
    from dramatiq_unique.suite import Suite

logger = logging.getLogger(__name__)

PENDING, FAILED = JobStatus.PENDING.value, JobStatus.FAILED.value
RETRY, CANCEL = "retry", "cancel"
#: Times a bulk retry's UPDATE is run again when a send took one of its keys between the statement's
#: look at the holders and its write (the unique index refused it: nothing was written).
MAX_ROUNDS = 5
#: Blocked jobs named in an outcome (the rest are counted).
MAX_NAMED = 10
#: Queue locks released per Redis round trip.
RELEASE_BATCH = 1_000


@dataclasses.dataclass(frozen=True)
class Selection:
    """Which rows a bulk action takes, besides its own statuses and the app's scope."""

    actor: Optional[str] = None
    unique_keys: Optional[tuple[str, ...]] = None  # these keys' rows only (an empty tuple: none)
    since: Optional[datetime] = None  # dead jobs failed, waiting jobs created, at or after it (naive UTC)
    error: Optional[str] = None  # dead jobs whose error holds this text (any case)
    statuses: tuple[str, ...] = WAITING  # the waiting statuses a cancel takes


@dataclasses.dataclass
class Outcome:
    """What a bulk action did, or (``preview``) would do."""

    action: str
    done: int = 0  # rows retried or cancelled; for a preview, the rows that match
    # Retry: rows left failed because another job holds (or takes) their key, and the first few of them as
    # (job id, the id of the job holding its key, or None when another retried one takes it).
    blocked: int = 0
    blocked_by: list[tuple[int, Optional[int]]] = dataclasses.field(default_factory=list)
    undeclared: int = 0  # rows that match, of actors this process does not declare: left as they are
    down: list[str] = dataclasses.field(default_factory=list)  # stores that did not answer
    preview: bool = False

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def matching(suite: "Suite", action: str, table: Any, sel: Selection) -> Any:
    """This app's rows (legacy ones too) of ``action``'s statuses that ``sel`` selects, any actor
    (``table``: the model or an alias of it)."""
    status = (table.status == FAILED) if action == RETRY else table.status.in_(sel.statuses)
    cond = table.app.in_((suite.app, NO_APP)) & status
    if sel.actor is not None:
        cond &= table.actor_name == sel.actor
    if sel.unique_keys is not None:
        cond &= table.unique_key.in_(sel.unique_keys)  # none: peewee writes "0 = 1"
    if sel.since is not None:
        cond &= (table.finished_at if action == RETRY else table.created_at) >= sel.since
    if sel.error:
        cond &= table.last_error.contains(sel.error)  # ILIKE on PostgreSQL, LIKE on SQLite; wildcards escaped
    return cond


def holds(suite: "Suite", model: type[JobModel], table: Any, names: tuple[str, ...]) -> Any:
    """Whether the row of ``table`` (``model`` or an alias) holds its key while it waits, in SQL: its lock
    type (its message's option, else its actor's, else the default) is not ``while_executing``.  Its options
    are named unqualified: the innermost query's row, which ``table`` must be."""
    configs = [(name, suite.actor_config(name)) for name in names]
    locks = [(name, config.unique_lock) for name, config in configs if config is not None]
    actors = pw.Case(table.actor_name, locks, opt.DEFAULT_UNIQUE_LOCK) if locks else opt.DEFAULT_UNIQUE_LOCK
    own = queries.fragment(model, "unique_lock_option", {})
    return table.unique_key.is_null(False) & (pw.fn.COALESCE(own, actors) != opt.WHILE_EXECUTING)


def preview(suite: "Suite", broker: Optional[dramatiq.Broker], action: str, sel: Selection) -> Outcome:
    """How many rows ``action`` would take now, and leave (actor not declared here); one COUNT per table."""
    return _act(suite, broker, action, sel, f"counting the jobs to {action}", None)


def _act(
    suite: "Suite", broker: Optional[dramatiq.Broker], action: str, sel: Selection, what: str,
    take: Optional[Callable[[Outcome, type[JobModel], tuple[str, ...], Any], None]],
) -> Outcome:
    """``take(outcome, model, declared actors, matching rows)`` in every job table of every store that answers
    (None: a preview, which counts them); matching rows of actors not declared here are counted."""
    scope, outcome = Scope(suite, broker), Outcome(action, preview=take is None)

    def act(index: int, tables: list[type[JobModel]]) -> None:
        for model in tables:
            names, matched = scope.names(model), matching(suite, action, model, sel)
            mine = pw.Case(None, [(model.actor_name.in_(names), 1)], 0)
            query = model.select(pw.fn.COUNT(model.id), pw.fn.SUM(mine)).where(matched)
            total, ours = cast(tuple, query.tuples().get())
            outcome.undeclared += int(total or 0) - int(ours or 0)
            if take is None:
                outcome.done += int(ours or 0)
            elif names:
                take(outcome, model, names, matched)

    outcome.down = [str(e) for e in lookup.each_store(suite, what, act)[1]]
    return outcome


def retry_all(suite: "Suite", broker: Optional[dramatiq.Broker], sel: Selection) -> Outcome:
    """Retry the dead jobs ``sel`` matches, left ``pending`` for the re-drive; one UPDATE per job table and store."""

    def take(outcome: Outcome, model: type[JobModel], names: tuple[str, ...], matched: Any) -> None:
        outcome.done += _retry(suite, model, names, sel)
        blocked = matched & model.actor_name.in_(names)
        outcome.blocked += model.select().where(blocked).count()
        if len(outcome.blocked_by) < MAX_NAMED:
            outcome.blocked_by += _blockers(suite, model, blocked, MAX_NAMED - len(outcome.blocked_by))

    outcome = _act(suite, broker, RETRY, sel, "retrying the dead set", take)
    logger.info("Bulk retry of %s: %d jobs made due again, %d blocked by a holder of their key, %d left "
                "(actor not declared here).", sel, outcome.done, outcome.blocked, outcome.undeclared)
    return outcome


def _retry(suite: "Suite", model: type[JobModel], names: tuple[str, ...], sel: Selection) -> int:
    def selected(table: Any) -> Any:
        return matching(suite, RETRY, table, sel) & table.actor_name.in_(names)

    holding = holds(suite, model, model, names)
    holder, newer = model.alias("holder"), model.alias("newer")
    held = pw.fn.EXISTS(holder.select(pw.SQL("1")).where(
        (holder.app == suite.app) & (holder.unique_hold == model.unique_key) & (holder.id != model.id)))
    # Two dead jobs of one key: the newest takes it back.  The newer one's conditions sit in a CASE, which no
    # index serves, so that the key's index is the subquery's only way in even with stale statistics.
    also = pw.Case(None, [(selected(newer) & (newer.id > model.id) & holds(suite, model, newer, names), 1)], 0)
    taken = pw.fn.EXISTS(newer.select(pw.SQL("1")).where((newer.unique_key == model.unique_key) & (also == 1)))
    cond = selected(model) & ~(holding & (held | taken))
    # As retry_job's claim, but pending; a row written before rows had an app is adopted, as a pass adopts it.
    fields = {**claim_fields(model), model.status: PENDING, model.enqueued_at: None, model.app: suite.app,
              model.fencing_token: model.fencing_token + 1, model.process_after: utcnow(), model.finished_at: None,
              model.parked_on: None, model.options: queries.fragment(model, "restarted_count", {}),
              model.unique_hold: pw.Case(None, [(holding, model.unique_key)], model.unique_hold)}
    db = model._meta.database
    for _ in range(MAX_ROUNDS):
        try:
            with db.atomic():  # a savepoint in the caller's transaction: a clash undoes only this statement
                return int(model.update(fields).where(cond).execute())
        except pw.IntegrityError:
            continue  # a send took one of the keys meanwhile: the next round sees its holder
    raise pw.IntegrityError(f"retrying the dead set of {model._meta.table_name}: its keys kept changing hands")


def _blockers(suite: "Suite", model: type[JobModel], blocked: Any, most: int) -> list[tuple[int, Optional[int]]]:
    """The first ``most`` rows left failed, each with the job holding its key (None: another dead job of
    the key was retried, or the holder failed meanwhile)."""
    left = list(model.select(model.id, model.unique_key).where(blocked).order_by(model.id.desc()).limit(most))
    found = jobs.holders(model, sorted({row.unique_key for row in left if row.unique_key is not None}), suite.app)
    return [(row.id, found[row.unique_key].id if row.unique_key in found else None) for row in left]


def cancel_fields(model: Any) -> dict:
    """What a cancel writes: finished, a new revision (its message is skipped when it arrives), its key
    freed, out of its lock or slot group, any deck reservation of it ended."""
    return {model.status: JobStatus.CANCELLED.value, model.finished_at: utcnow(), model.revision: model.revision + 1,
            model.unique_hold: None, model.parked_on: None, model.lease_until: None, model.missing_since: None}


def cancel_all(suite: "Suite", broker: Optional[dramatiq.Broker], sel: Selection) -> Outcome:
    """Cancel the waiting jobs ``sel`` matches: one UPDATE per job table and store, then their queue locks
    released in batches."""
    bad = [s for s in sel.statuses if s not in WAITING]
    if bad or not sel.statuses:
        raise ValueError(f"only waiting jobs can be cancelled ({', '.join(WAITING)}), not {', '.join(bad) or 'none'}")
    locks: list[tuple[str, str]] = []

    def take(outcome: Outcome, model: type[JobModel], names: tuple[str, ...], matched: Any) -> None:
        update = model.update(cancel_fields(model)).where(matched & model.actor_name.in_(names))
        lock_token = queries.fragment(model, "queue_lock_token", {})
        freed = list(update.returning(model.unique_key, lock_token).tuples().execute())
        outcome.done += len(freed)
        locks.extend((suite.keys.queue_lock(key), token) for key, token in freed if key and token)

    outcome = _act(suite, broker, CANCEL, sel, "cancelling waiting jobs", take)
    release_all(suite, locks)
    logger.info("Bulk cancel of %s: %d jobs cancelled, %d left (actor not declared here).", sel, outcome.done,
                outcome.undeclared)
    return outcome


def release_all(suite: "Suite", locks: list[tuple[str, str]]) -> None:
    """Release each ``(lock name, token)`` where the token still holds it, on every master, in batches; a
    master that fails leaves its locks to their TTL."""
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
