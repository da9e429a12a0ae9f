"""The re-drive: one pass that sends what came due and recovers what the broker lost.

A pass, for every job store (the primary first; one that is down is skipped, with a
warning, and the others go on) and every job table in it:

1. wakes parked jobs whose lock or slot holder is gone (parking/lot.py);
2. sends due ``pending`` jobs (scheduled, outbox rows whose publish
   failed, jobs woken from parking) and ``retrying`` jobs whose retry
   message never reached the broker (``enqueued_at`` is NULL);
3. looks at ``queued``, ``retrying`` and ``running`` jobs overdue by
   ``lost_after`` (due, or lease run out, that long ago) whose message is
   in none of the broker's places (broker/presence.py): a first miss marks the
   row (``missing_since``), a miss in a later pass confirms it, and
   ``on_lost`` applies;
4. deletes finished rows older than ``retention``.

Before step 2, at most once per ``lost_after``: rows in a combination of columns
that no state allows (none should be) are set right, loudly (repair.py).

Step 1 is the primary's alone: only its jobs park (storage/stores.py).

Every step acts only on rows of this process's app, of actors it declares
on ``broker`` (scope.py): apps that share the database never touch each
other's jobs, and a row is never sent into a broker that cannot run it.

Correctness does not rest on the pass lock, which only saves work: rows are claimed by conditional
UPDATEs (after ``SELECT ... FOR UPDATE SKIP LOCKED`` on PostgreSQL; SQLite's IMMEDIATE transactions
serialise the writers), so two passes never both send one job.  A claim also bumps the
row's ``revision``, which the worker checks when the job starts: an
older copy of a re-sent message is skipped, never run beside the new one.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Optional

import dramatiq
import redis

from dramatiq_unique import options as opt
from dramatiq_unique import suite as _config
from dramatiq_unique.broker.presence import Presence, probe_for
from dramatiq_unique.broker.refs import resending
from dramatiq_unique.context import MARKER
from dramatiq_unique.durable import claims, deferral, repair
from dramatiq_unique.durable.claims import FAILED, PENDING, QUEUED, RETRYING, RUNNING
from dramatiq_unique.durable.counts import RedriveCounts, record_end
from dramatiq_unique.durable.lost import actor_options, retries_exhausted
from dramatiq_unique.durable.scope import Scope
from dramatiq_unique.errors import DatabaseUnavailable, RedisUnavailable
from dramatiq_unique.locks import queue
from dramatiq_unique.observe import events, metrics_on
from dramatiq_unique.parking import lot
from dramatiq_unique.slots import overrides
from dramatiq_unique.storage import history, jobs
from dramatiq_unique.storage.models import MAX_ERROR_LENGTH, JobModel, after_ms, utcnow
from dramatiq_unique.storage.stores import CONNECTION_ERRORS, unreachable

if TYPE_CHECKING:
    from dramatiq_unique.suite import Suite

logger = logging.getLogger(__name__)

#: ms the pass lock lasts unless extended (it is, after every page): a process killed
#: mid-pass holds up the cluster's re-drive for at most this long.
PASS_LOCK_TTL = 10_000
#: ms that must separate the first and the confirming miss of a message.
CONFIRM_AFTER = 100
#: Pages a pass handles at most per step and table; the rest waits for the next pass.
MAX_PAGES = 100


def redrive(broker: Optional[dramatiq.Broker] = None, *, suite: Optional["Suite"] = None) -> RedriveCounts:
    """Run one re-drive pass, unless another process is running one; returns its counts."""
    suite = suite or _config.current()
    broker = broker or suite.broker or dramatiq.get_broker()
    scope = Scope(suite, broker)
    name = scope.lock_name()
    token, _ = suite.locks.acquire(name, PASS_LOCK_TTL)
    if token is None:
        return RedriveCounts(ran=False)
    try:
        return run_pass(suite, broker, lock_token=token, scope=scope)
    finally:
        try:
            suite.locks.release(name, token)
        except RedisUnavailable:
            logger.warning("Could not release the re-drive lock; it expires in %d ms.", PASS_LOCK_TTL)


def run_pass(
    suite: "Suite", broker: dramatiq.Broker, *, lock_token: Optional[str] = None, scope: Optional[Scope] = None
) -> RedriveCounts:
    """One pass, without taking the pass lock (``redrive()`` takes it)."""
    try:
        with jobs.db_errors("re-drive pass"):
            counts = _Pass(suite, broker, lock_token, scope or Scope(suite, broker)).run()
    except redis.RedisError as e:
        raise RedisUnavailable(f"re-drive pass: {e}") from e
    record_end(suite)
    return counts


class _Pass:
    def __init__(self, suite: "Suite", broker: dramatiq.Broker, lock_token: Optional[str], scope: Scope) -> None:
        self.suite = suite
        self.broker = broker
        self.lock_token = lock_token
        self.scope = scope
        self.lock_name = scope.lock_name()
        self.counts = RedriveCounts()
        self.started = utcnow()
        self.page = int(suite.settings.redrive_page_size)
        self.probe = probe_for(broker)
        self.broker_down = False

    def run(self) -> RedriveCounts:
        stores = self.suite.stores
        for index in range(len(stores)):
            try:
                self._run_store(index)
            except CONNECTION_ERRORS as e:
                if not stores.several:
                    raise
                # One store down must not hold up the others' jobs: the next pass tries it again.
                self.counts.errors += 1
                if unreachable(e):  # not for a deadlock or a timeout: the store answers, sends may use it
                    stores.mark_down(index, e, quiet=True)
                logger.warning("The re-drive skips job %s this pass: %s", stores.name(index), str(e).strip())
        deferral.log_backlog(self.counts.deferred)
        events.redrive_pass(self.counts)
        return self.counts

    def _run_store(self, index: int) -> None:
        stores = self.suite.stores
        if index == 0:
            self._wake_parked()  # parked jobs (locks, slots) are the primary's alone
        for base in self.scope.models():  # only tables with rows of actors this process declares
            if stores.several:
                stores.ensure(base, index)  # a store down at set-up gets its tables now
            model = stores.model_in(base, index)
            self.counts.adopted += self.scope.adopt(model, self.page, MAX_PAGES)
            if repair.due(self.suite, model):  # before the sends and the lost check, which then take them
                self.counts.repaired += repair.repair(model, self.scope.where(model))
            self._send_due(model)
            self._check_lost(model)
            self._prune(model)

    def _keep_lock(self) -> None:
        if self.lock_token is None:
            return
        if not self.suite.locks.extend(self.lock_name, self.lock_token, PASS_LOCK_TTL):
            # Harmless for correctness (claims are conditional); another pass may start.
            logger.warning("The re-drive lock expired during a pass.")

    # -- 1. parked jobs -----------------------------------------------------------

    def _wake_parked(self) -> None:
        # Parked rows (pending, parked_on set) wait for an execution lock or a slot;
        # sending them would only park them again.  Their wake-ups live in Redis and
        # can be lost (a holder killed, Redis wiped): wake every group with no holder.
        # The run-time limits first: a Redis that lost them (or a replica promoted without a later
        # change) gets them back before a group is woken at its declared limit.
        try:
            if overrides.check(self.suite):
                logger.info("The re-drive put back run-time limits that Redis had lost or held otherwise.")
        except DatabaseUnavailable:
            pass  # the primary is down: the pass reports it, and looks again next time
        except RedisUnavailable as e:
            logger.warning("The re-drive could not compare the run-time limits with Redis: %s", e)
        self.counts.woken += lot.wake_orphans(self.suite)
        if metrics_on():  # the parked-jobs gauge: one query per table, only with metrics on
            events.parked_counts(lot.parked_counts(self.scope.models(), self.suite.app, self.suite.actors.values()))

    # -- 2. due jobs --------------------------------------------------------------

    def _send_due(self, model: type[JobModel]) -> None:
        for status in (PENDING, RETRYING):
            for _ in range(MAX_PAGES):
                if self.broker_down:
                    return
                cond = claims.due(model, status, utcnow()) & self.scope.where(model)
                rows = claims.claim_page(model, cond, self.page)
                if rows:
                    self.counts.sent += self._publish(model, rows, revert_to=status)
                    self._keep_lock()
                if len(rows) < self.page:
                    break

    def _order_key(self, row: JobModel) -> tuple:
        config = self.suite.actor_config(row.actor_name)
        order = opt.DEFAULT_UNIQUE_ORDER_BY if config is None else config.for_message(row.options or {}).unique_order_by
        when = row.process_after if order == "process_after" and row.process_after else row.created_at
        return (when, row.id)

    def _publish(self, model: type[JobModel], rows: list[JobModel], *, revert_to: str) -> int:
        """Send claimed rows in order; on a broker failure, hand the rest back and stop sending."""
        rows = sorted(rows, key=self._order_key)
        refs: dict[int, str] = {}
        for i, row in enumerate(rows):
            try:
                with resending():
                    sent = self.broker.enqueue(claims.build_message(row))
            except Exception as e:
                self.broker_down = True
                self.counts.errors += 1
                deferral.send_failed(self.suite, self.broker, row.message_id, e)  # the next pass tries again
                jobs.unclaim_sends(model, [r.id for r in rows[i:]], revert_to)
                break
            refs[row.id] = sent.options.get("redis_message_id") or row.message_id
            self.counts.deferred += deferral.was_deferred(row)
        jobs.record_refs(model, refs)  # a ref set meanwhile is newer: kept
        return len(refs)

    # -- 3. lost jobs ---------------------------------------------------------------

    def _check_lost(self, model: type[JobModel]) -> None:
        cutoff = after_ms(-self.suite.settings.lost_after)
        marked_before = after_ms(-CONFIRM_AFTER, self.started)
        groups = claims.suspects(model, cutoff, marked_before, can_probe=self.probe is not None)
        for status, cond, order in groups:
            for _ in range(MAX_PAGES):
                if self.broker_down:
                    return
                rows = list(claims.suspect_query(model, cond & self.scope.where(model), order, self.page))
                if rows:
                    self._judge(model, status, rows)
                    self._keep_lock()
                if len(rows) < self.page:
                    break

    def _judge(self, model: type[JobModel], status: str, rows: list[JobModel]) -> None:
        if self.probe is not None:
            answers = self.probe.check(rows)
        else:
            # Only rows the broker cannot vouch for were read: running ones whose
            # lease ran out, and claims whose publish was never confirmed.
            answers = [Presence.MISSING] * len(rows)
        present = [row for row, answer in zip(rows, answers, strict=True) if answer is Presence.PRESENT]
        if present:
            model.update(checked_at=utcnow(), missing_since=None).where(
                model.id.in_([row.id for row in present]) & (model.status == status)
            ).execute()
            if self.probe is not None:  # held by dead workers; a retry a live worker dropped (presence.py)
                self.counts.requeued += self.probe.requeue_orphans(present)
                self.counts.released += self.probe.release_stranded(present) if status == RETRYING else 0
        claimed = []
        for row, answer in zip(rows, answers, strict=True):
            if answer is Presence.DEAD:
                self._fail(model, row, "the broker dead-lettered the job's message")
            elif answer is Presence.MISSING:
                since = (row.started_at if row.status == RUNNING else row.enqueued_at) or row.created_at
                if row.missing_since is not None and row.missing_since >= since:
                    claimed += self._lost(model, row)  # missed in an earlier pass, in this same state
                else:
                    marked = model.update(missing_since=utcnow()).where(claims.unchanged(model, row)).execute()
                    self.counts.missing += marked
        if claimed:  # sent as one batch, so the broker ids are recorded in one statement
            self.counts.redriven += self._publish(model, claimed, revert_to=PENDING if status == QUEUED else RETRYING)

    def _lost(self, model: type[JobModel], row: JobModel) -> list[JobModel]:
        """Apply ``on_lost`` to a job confirmed lost; returns it claimed, if it is to be sent again."""
        self.counts.lost += 1
        where = "running" if row.status == RUNNING else "waiting"
        if self.suite.settings.on_lost == "fail":
            self._fail(model, row, f"lost while {where}: its message is in none of the broker's queues")
            return []
        if row.status == RUNNING and retries_exhausted(self.suite, self.broker, row):
            self._fail(model, row, "lost while running, and its retries are exhausted")
            return []
        extra: dict[str, Any] = {}
        if row.status == RUNNING:
            extra["last_error"] = f"attempt {row.attempts} lost: its worker or the broker dropped the message"
            extra["history"] = history.append(model, jobs.attempt_of(row, extra, "lost"))
        claimed = claims.claim_one(model, row, **extra)
        if claimed is not None:
            events.job_lost(row, where, "sent again")
        return [] if claimed is None else [claimed]

    def _fail(self, model: type[JobModel], row: JobModel, reason: str) -> None:
        options = row.options or {}
        lock = opt.lookup(options, actor_options(self.suite, self.broker, row.actor_name), "unique_lock",
                          opt.DEFAULT_UNIQUE_LOCK)
        if row.last_error:  # the re-drive only saw the message go; keep the cause an attempt recorded
            reason = f"{reason}; the last error recorded before: {row.last_error}"[:MAX_ERROR_LENGTH]
        fields: dict[str, Any] = {"status": FAILED, "finished_at": utcnow(), "lease_until": None, "last_error": reason}
        if lock != opt.UNTIL_EXPIRED:
            fields["unique_hold"] = None  # a failed job no longer blocks its key
        if row.status == RUNNING:
            fields["history"] = history.append(model, jobs.attempt_of(row, fields, "lost"))
        if not model.update(**fields).where(claims.unchanged(model, row)).execute():
            return
        self.counts.failed += 1
        events.job_failed(row, reason)
        token = (options.get(MARKER) or {}).get("qt")
        if lock != opt.UNTIL_EXPIRED:
            queue.release_key(self.suite, row.unique_key, token, row.message_id)

    # -- 4. pruning -----------------------------------------------------------------

    def _prune(self, model: type[JobModel]) -> None:
        self.counts.pruned += claims.prune(model, self.scope.prunable(model), self.suite.settings, page=self.page,
                                           max_pages=MAX_PAGES, after_page=self._keep_lock)
