"""The re-drive: a pass that sends what came due and recovers what the broker lost, and its timer.

Claims are conditional UPDATEs, so two passes never send one job; the pass lock only saves work.
See docs/discussions/how-it-is-built.md.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Callable, Optional

import dramatiq
import peewee as pw
import redis
from apscheduler.schedulers.background import BackgroundScheduler
from dramatiq.middleware import Retries

from dramatiq_unique import errors
from dramatiq_unique import options as opt
from dramatiq_unique import suite as _config
from dramatiq_unique.broker.presence import Presence, probe_for
from dramatiq_unique.broker.refs import broker_ref, resending
from dramatiq_unique.context import MARKER
from dramatiq_unique.durable import deferral
from dramatiq_unique.durable.messages import build_message, retries_so_far
from dramatiq_unique.durable.scope import Scope
from dramatiq_unique.errors import DatabaseUnavailable, DependencyUnavailable, InvalidOption, RedisUnavailable
from dramatiq_unique.guard import guarded
from dramatiq_unique.locks import queue
from dramatiq_unique.logs import QuietTicks
from dramatiq_unique.observe import events, metrics_on
from dramatiq_unique.parking import lot
from dramatiq_unique.slots import overrides
from dramatiq_unique.storage import jobs
from dramatiq_unique.storage.database import DB_ERRORS, is_postgres
from dramatiq_unique.storage.models import FINISHED, MAX_ERROR_LENGTH, WAITING, JobModel, JobStatus, after_ms, utcnow
from dramatiq_unique.storage.stores import unreachable

if TYPE_CHECKING:
    from apscheduler.schedulers.base import BaseScheduler

    from dramatiq_unique.suite import Suite

logger = logging.getLogger(__name__)

PENDING, QUEUED, RUNNING = JobStatus.PENDING.value, JobStatus.QUEUED.value, JobStatus.RUNNING.value
RETRYING, FAILED = JobStatus.RETRYING.value, JobStatus.FAILED.value
#: ms the pass lock lasts unless extended (after every page): a process killed mid-pass holds up
#: the cluster's re-drive for at most this long.
PASS_LOCK_TTL = 10_000
#: ms that must separate the first and the confirming miss of a message.
CONFIRM_AFTER = 100
#: Pages a pass handles at most per step and table; the rest waits for the next pass.
MAX_PAGES = 100
#: Id of the re-drive job in the scheduler (suffixed with the suite's key prefix).
JOB_ID = "dramatiq_unique.redrive"


@dataclasses.dataclass
class RedriveCounts:
    """What one pass did; ``ran`` is False when another process held the pass lock."""

    ran: bool = True
    sent: int = 0  # due pending and retrying jobs
    woken: int = 0  # parked jobs whose lock or slot holder was gone
    missing: int = 0  # jobs whose message was missed a first time (checked again next pass)
    lost: int = 0  # jobs confirmed lost
    redriven: int = 0  # lost jobs sent again (on_lost="redrive")
    failed: int = 0  # lost under on_lost="fail", retries exhausted, or dead-lettered
    requeued: int = 0  # queues whose messages held by dead workers were handed back (Redis broker)
    released: int = 0  # retries a live worker had dropped, handed back to their delay queue (Redis broker)
    pruned: int = 0  # finished rows deleted after retention
    errors: int = 0  # sends that failed (broker down): those jobs wait for the next pass
    adopted: int = 0  # rows written without an app (an earlier version) that this app took
    repaired: int = 0  # rows in a combination of columns that no state allows, set right
    deferred: int = 0  # jobs sent (of sent and redriven) that were kept pending while the broker was down

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    # Read like a dict too: counts["sent"], dict(counts).
    def __getitem__(self, name: str) -> Any:
        return self.as_dict()[name]

    def keys(self) -> list[str]:
        return list(self.__dataclass_fields__)


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
    with guarded("re-drive pass"):
        try:
            counts = _Pass(suite, broker, lock_token, scope or Scope(suite, broker)).run()
        except redis.RedisError as e:
            raise RedisUnavailable(f"re-drive pass: {e}") from e
    try:  # when the app's last pass ended, for the check command: a Redis key, not a row written every pass
        suite.redis.set(suite.keys.last_pass(), int(time.time() * 1000))
    except redis.RedisError as e:
        logger.warning("Could not record the end of the re-drive pass: %s", e)
    return counts


# -- the queries and claims of a pass -------------------------------------------------------------


def prune(
    model: type[JobModel], scope: Any, settings: Any, *, page: int, max_pages: int,
    after_page: Callable[[], None] = lambda: None,
) -> int:
    """Delete ``model``'s finished rows (of ``scope``) past ``retention``, a page at a time; returns how many."""
    # Rows hold idempotency keys for their window: keep them at least that long.
    cutoff = after_ms(-max(settings.retention, settings.idempotency_window))
    finished = (model.finished_at < cutoff) & model.status.in_(FINISHED) & scope
    pruned = 0
    query: pw.Select = model.select(model.id).where(finished).limit(page)
    for _ in range(max_pages):
        ids = [row_id for (row_id,) in query.tuples()]
        if ids:
            pruned += model.delete().where(model.id.in_(ids)).execute()
            after_page()
        if len(ids) < page:
            break
    return pruned


def claim_fields(model: type[JobModel], **extra: Any) -> dict:
    """The UPDATE that takes a row for sending: queued, a new revision, no broker id yet."""
    fields = {model.status: QUEUED, model.enqueued_at: utcnow(), model.revision: model.revision + 1,
              model.broker_ref: None, model.checked_at: None, model.missing_since: None, model.lease_until: None}
    return {**fields, **{getattr(model, name): value for name, value in extra.items()}}


def claim_page(model: type[JobModel], cond: Any, page: int) -> list[JobModel]:
    """Claim up to ``page`` rows matching ``cond``; returns them as claimed."""
    db = model._meta.database
    with db.atomic():
        # process_after alone: the index gives that order, so LIMIT stops early (no sort of the backlog).
        query: pw.Select = model.select(model.id).where(cond).order_by(model.process_after).limit(page)
        if is_postgres(db):
            query = query.for_update(skip_locked=True)
        ids = [row_id for (row_id,) in query.tuples()]
        if not ids:
            return []
        # The ids as values, not a subquery, which PostgreSQL may run again for every row it updates.  The
        # condition again: a row another pass claimed meanwhile no longer matches.
        update = model.update(claim_fields(model)).where(model.id.in_(ids) & cond)
        return list(update.returning(*sending_fields(model)).execute())


def sending_fields(model: type[JobModel]) -> list[pw.Field]:
    """The columns that sending a claimed row needs (not the whole, wide row)."""
    names = ("id", "message_id", "actor_name", "queue_name", "args", "kwargs", "options", "revision",
             "attempts", "created_at", "process_after", "status")
    return [model._meta.fields[name] for name in names]


def send_claimed(
    suite: "Suite", broker: dramatiq.Broker, model: type[JobModel], claimed: list[JobModel], revert_to: str,
) -> list[JobModel]:
    """Send claimed rows in order and record their broker ids; on a failure, hand the rest back to
    ``revert_to`` for the next pass, and stop.  Returns the rows sent."""
    refs: dict[int, str] = {}
    for i, row in enumerate(claimed):
        try:
            with resending():
                refs[row.id] = broker_ref(broker.enqueue(build_message(row)))
        except Exception as e:
            deferral.send_failed(suite, broker, row.message_id, e)
            jobs.unclaim_sends(model, [r.id for r in claimed[i:]], revert_to)
            break
    jobs.record_refs(model, refs)  # a ref set meanwhile is newer: kept
    return claimed[:len(refs)]


def unchanged(model: type[JobModel], row: JobModel) -> Any:
    """The row is still as it was read: nobody started, finished, renewed or re-sent it since."""
    cond = (model.id == row.id) & (model.status == row.status) & (model.revision == row.revision)
    cond &= model.fencing_token == row.fencing_token
    cond &= model.broker_ref.is_null() if row.broker_ref is None else (model.broker_ref == row.broker_ref)
    if row.lease_until is not None:
        cond &= model.lease_until == row.lease_until  # a heartbeat renewed it: alive
    return cond


# -- a lost job: its actor's options, and whether Retries would give up -----------------------------


class JobLost(errors.DramatiqUniqueError):
    """The job's message is in none of the broker's queues"""


def retries_exhausted(suite: "Suite", broker: dramatiq.Broker, row: JobModel) -> bool:
    """Whether Dramatiq's Retries would give up after this (lost) attempt, decided as it decides."""
    retries_mw = next((m for m in broker.middleware if isinstance(m, Retries)), None)
    if retries_mw is None:
        return True  # without Retries a failed attempt is final
    # A pass's rows are of the actors its suite declares (Scope).
    config, row_options = suite.actor_config(row.actor_name), row.options or {}
    options = config.options if config is not None else {}
    retries = max(retries_so_far(row) - 1, 0)  # a retry_job() restarts the count
    retry_when = options.get("retry_when", retries_mw.retry_when)
    if retry_when is not None:
        return not retry_when(retries, JobLost(row.message_id))
    max_retries = row_options.get("max_retries", options.get("max_retries", retries_mw.max_retries))
    return max_retries is not None and retries >= max_retries


# -- rows no state allows: each state's way out, added where it is missing ---------------------------

#: (what is wrong, the rows, the fields that set them right), each a function of the table.
REPAIRS: tuple[tuple[str, Callable[[Any], Any], Callable[[Any], dict]], ...] = (
    # Not pending: no waker takes it.  Out of the group, the row's own state has its way out.
    ("parked but not pending", lambda m: m.parked_on.is_null(False) & (m.status != PENDING),
     lambda m: {m.parked_on: None}),
    # The lost-message check waits for a lease that ran out: one that runs out now.
    ("running without a lease", lambda m: (m.status == RUNNING) & m.lease_until.is_null(),
     lambda m: {m.lease_until: utcnow()}),
    # The sends and the lost-message check wait until it is due: due since it was sent.
    ("waiting without a due time", lambda m: m.status.in_(WAITING) & m.process_after.is_null(),
     lambda m: {m.process_after: m.created_at}),
    # The lost-message check waits until its message is overdue: sent now, as far as it can tell.
    ("queued without the time it was sent", lambda m: (m.status == QUEUED) & m.enqueued_at.is_null(),
     lambda m: {m.enqueued_at: utcnow()}),
)

def repair(model: type[JobModel], scope: Any) -> int:
    """Set right, each with an ERROR, the rows no state allows; conditional UPDATEs: a row that moved on
    meanwhile no longer matches."""
    repaired = 0
    for what, found_by, fields in REPAIRS:
        found = list(
            model.update(fields(model)).where(found_by(model) & scope)
            .returning(model.id, model.message_id, model.actor_name, model.status, model.unique_key).execute()
        )
        for row in found:
            logger.error("Job %s (%s, row %s) was %s (status %s), a state nothing takes it out of; the re-drive "
                         "repaired its row.  A path of the suite left it so: please report it.",
                         row.message_id, row.actor_name, row.id, what, row.status,
                         extra=events.fields(row.message_id, row.actor_name, row.unique_key))
        repaired += len(found)
    return repaired


# -- a pass ---------------------------------------------------------------------------------------


class _Pass:
    def __init__(self, suite: "Suite", broker: dramatiq.Broker, lock_token: Optional[str], scope: Scope) -> None:
        self.suite, self.broker, self.lock_token, self.scope = suite, broker, lock_token, scope
        self.lock_name, self.counts, self.started = scope.lock_name(), RedriveCounts(), utcnow()
        self.page, self.probe, self.broker_down = int(suite.settings.redrive_page_size), probe_for(broker), False

    def run(self) -> RedriveCounts:
        stores = self.suite.stores
        for index in range(len(stores)):
            try:
                self._run_store(index)
            except DB_ERRORS as e:
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
            # Before the sends and the lost check, which then take them; once per lost_after in the cluster:
            # a look reads the parked and queued backlog through, and a repaired row waits lost_after anyway.
            looked = f"{self.lock_name}:repaired:{index}:{model._meta.table_name}"
            if self.suite.redis.set(looked, 1, nx=True, px=int(self.suite.settings.lost_after)):
                self.counts.repaired += repair(model, self.scope.where(model))
            self._send_due(model)
            self._check_lost(model)
            self.counts.pruned += prune(model, self.scope.prunable(model), self.suite.settings, page=self.page,
                                        max_pages=MAX_PAGES, after_page=self._keep_lock)

    def _keep_lock(self) -> None:
        if self.lock_token is not None and not self.suite.locks.extend(self.lock_name, self.lock_token, PASS_LOCK_TTL):
            logger.warning("The re-drive lock expired during a pass.")  # harmless: claims are conditional

    def _wake_parked(self) -> None:
        # Wake-ups live in Redis and can be lost (a holder killed, Redis wiped): wake every group with no
        # holder, after putting back run-time limits Redis lost (a group is not woken at its declared limit).
        try:
            if overrides.check(self.suite):
                logger.info("The re-drive put back run-time limits that Redis had lost or held otherwise.")
        except DatabaseUnavailable:
            pass  # the primary is down: the pass reports it, and looks again next time
        except RedisUnavailable as e:
            logger.warning("The re-drive could not compare the run-time limits with Redis: %s", e)
        self.counts.woken += lot.of(self.suite).wake_orphans()
        if metrics_on():  # the parked-jobs gauge: one query per table, only with metrics on
            events.parked_counts(lot.parked_counts(self.scope.models(), self.suite.app, self.suite.actors.values()))

    def _send_due(self, model: type[JobModel]) -> None:
        for status in (PENDING, RETRYING):
            for _ in range(MAX_PAGES):
                if self.broker_down:
                    return
                due = (model.status == status) & (model.process_after <= utcnow()) & model.parked_on.is_null()
                if status == RETRYING:  # only a retry that never reached the broker
                    due &= model.enqueued_at.is_null()
                claimed = claim_page(model, due & self.scope.where(model), self.page)
                if claimed:
                    self.counts.sent += self._publish(model, claimed, revert_to=status)
                    self._keep_lock()
                if len(claimed) < self.page:
                    break

    def _order_key(self, row: JobModel) -> tuple:
        config, order = self.suite.actor_config(row.actor_name), opt.DEFAULT_UNIQUE_ORDER_BY
        if config is not None:
            order = config.for_message(row.options or {}).unique_order_by
        when = row.process_after if order == "process_after" and row.process_after else row.created_at
        return (when, row.id)

    def _publish(self, model: type[JobModel], claimed: list[JobModel], *, revert_to: str) -> int:
        sent = send_claimed(self.suite, self.broker, model, sorted(claimed, key=self._order_key), revert_to)
        if len(sent) < len(claimed):  # the broker failed: no more sends this pass
            self.broker_down = True
            self.counts.errors += 1
        self.counts.deferred += sum(map(deferral.was_deferred, sent))
        return len(sent)

    def _check_lost(self, model: type[JobModel]) -> None:
        # Jobs overdue by lost_after, each looked for at most once per lost_after; one marked missing less
        # than CONFIRM_AFTER before this pass started waits for a later pass.
        cutoff = after_ms(-self.suite.settings.lost_after)
        fresh = model.checked_at.is_null() | (model.checked_at <= cutoff)
        unmarked = model.missing_since.is_null() | (model.missing_since <= after_ms(-CONFIRM_AFTER, self.started))
        groups = [(RUNNING, (model.status == RUNNING) & (model.lease_until <= cutoff), model.lease_until)]
        for status in (QUEUED, RETRYING):
            cond = (model.status == status) & (model.process_after <= cutoff) & (model.enqueued_at <= cutoff)
            if self.probe is None:
                # The broker cannot be asked: trust it with what it took (broker_ref is set after the publish).
                cond &= model.broker_ref.is_null()
            groups.append((status, cond, model.process_after))
        for status, cond, order in groups:
            cond = cond & fresh & unmarked & self.scope.where(model)
            for _ in range(MAX_PAGES):
                if self.broker_down:
                    return
                found = list(model.select().where(cond).order_by(order).limit(self.page))
                if found:
                    self._judge(model, status, found)
                    self._keep_lock()
                if len(found) < self.page:
                    break

    def _judge(self, model: type[JobModel], status: str, found: list[JobModel]) -> None:
        # Without a probe, only rows the broker cannot vouch for were read: running ones whose lease ran
        # out, and claims whose publish was never confirmed.
        answers = self.probe.check(found) if self.probe is not None else [Presence.MISSING] * len(found)
        present = [row for row, answer in zip(found, answers, strict=True) if answer is Presence.PRESENT]
        if present:
            model.update(checked_at=utcnow(), missing_since=None).where(
                model.id.in_([row.id for row in present]) & (model.status == status)
            ).execute()
            if self.probe is not None:  # held by dead workers; a retry a live worker dropped (presence.py)
                self.counts.requeued += self.probe.requeue_orphans(present)
                self.counts.released += self.probe.release_stranded(present) if status == RETRYING else 0
        claimed = []
        for row, answer in zip(found, answers, strict=True):
            if answer is Presence.DEAD:
                self._fail(model, row, "the broker dead-lettered the job's message")
            elif answer is Presence.MISSING:
                since = (row.started_at if row.status == RUNNING else row.enqueued_at) or row.created_at
                if row.missing_since is not None and row.missing_since >= since:
                    claimed += self._lost(model, row)  # missed in an earlier pass, in this same state
                else:
                    self.counts.missing += model.update(missing_since=utcnow()).where(unchanged(model, row)).execute()
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
            extra["history"] = jobs.history_append(model, jobs.attempt_of(row, extra, "lost"))
        claimed = list(model.update(claim_fields(model, **extra)).where(unchanged(model, row))
                       .returning(*sending_fields(model)).execute())
        if claimed:
            events.job_lost(row, where, "sent again")
        return claimed

    def _fail(self, model: type[JobModel], row: JobModel, reason: str) -> None:
        options = row.options or {}
        config = self.suite.actor_config(row.actor_name)
        lock = config.for_message(options).unique_lock if config is not None else opt.DEFAULT_UNIQUE_LOCK
        if row.last_error:  # the re-drive only saw the message go; keep the cause an attempt recorded
            reason = f"{reason}; the last error recorded before: {row.last_error}"[:MAX_ERROR_LENGTH]
        fields: dict[str, Any] = {"status": FAILED, "finished_at": utcnow(), "lease_until": None, "last_error": reason}
        if lock != opt.UNTIL_EXPIRED:
            fields["unique_hold"] = None  # a failed job no longer blocks its key
        if row.status == RUNNING:
            fields["history"] = jobs.history_append(model, jobs.attempt_of(row, fields, "lost"))
        if not model.update(**fields).where(unchanged(model, row)).execute():
            return
        self.counts.failed += 1
        events.job_failed(row, reason)
        if lock != opt.UNTIL_EXPIRED:
            queue.release_key(self.suite, row.unique_key, (options.get(MARKER) or {}).get("qt"), row.message_id)


# -- on a timer -------------------------------------------------------------------------------------


def start_redriver(
    interval: Optional[float] = None, *, suite: Optional["Suite"] = None, broker: Optional[dramatiq.Broker] = None,
    scheduler: Optional["BaseScheduler"] = None,
) -> "BaseScheduler":
    """Run :func:`redrive` every ``interval`` ms (default: ``redrive_interval``), the first pass at once, in a
    new started ``BackgroundScheduler`` (stop it with ``shutdown()``) or in ``scheduler`` (the caller's).
    Every process may run one: the pass lock lets one pass run at a time, a tick that finds it taken is skipped.
    """
    suite = suite or _config.current()
    interval = suite.settings.redrive_interval if interval is None else interval
    if isinstance(interval, bool) or not isinstance(interval, (int, float)) or interval <= 0:
        raise InvalidOption(f"interval must be a positive number of milliseconds, not {interval!r}")
    QuietTicks.install()
    own = scheduler is None
    scheduler = BackgroundScheduler(timezone=timezone.utc, daemon=True) if scheduler is None else scheduler
    # A pass slower than the interval: skip the ticks it overlapped, never pile them up.
    scheduler.add_job(_tick, "interval", seconds=interval / 1000, args=(suite, broker),
                      id=f"{JOB_ID}:{suite.keys.prefix}", name="dramatiq_unique re-drive", replace_existing=True,
                      max_instances=1, coalesce=True, misfire_grace_time=None, next_run_time=datetime.now(timezone.utc))
    if own:
        scheduler.start()
    return scheduler


def _tick(suite: "Suite", broker: Optional[dramatiq.Broker]) -> None:
    try:
        counts = redrive(broker, suite=suite)
        busy = {k: v for k, v in counts.as_dict().items() if k != "ran" and v}
        if busy:
            logger.info("Re-drive pass: %s.", ", ".join(f"{k}={v}" for k, v in busy.items()))
    except DependencyUnavailable as e:
        logger.warning("Re-drive pass skipped: %s", e)
    except Exception:
        logger.exception("Re-drive pass failed.")
    finally:
        suite.close()  # this scheduler thread's database connection
