"""Several apps on one database (guarantee 7), on SQLite and PostgreSQL.

Two apps in one process: each its own RedisBroker namespace and suite
``key_prefix``, both on the test's one database.  Both declare an actor
named ``job``, so that only the rows' app tells their jobs apart.
"""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any, Iterator, Optional

import dramatiq
import pytest
from dramatiq.brokers.redis import RedisBroker

import dramatiq_unique
from dramatiq_unique import InvalidOption, JobModel, concurrency_status, submit
from dramatiq_unique.durable.redrive import redrive
from dramatiq_unique.durable.scope import Scope
from dramatiq_unique.parking import lot
from dramatiq_unique.slots.gate import gate_of
from dramatiq_unique.storage import jobs, queries
from dramatiq_unique.storage.models import after_ms, utcnow
from dramatiq_unique.suite import set_current
from tests.conftest import REDIS_URL
from tests.durable import CONFIRM_AFTER, RedisServer, broker_messages, bulk_insert_pg, wipe_broker
from tests.helpers import LOST_AFTER, wait_until


class App:
    """One app: its broker (own namespace), its suite (own key_prefix) and its actors."""

    def __init__(
        self, name: str, database_url: str, *, redis_url: str = REDIS_URL, unique: bool = False,
        options: Optional[dict] = None,
    ) -> None:
        self.broker = RedisBroker(url=redis_url, namespace=f"{name}-broker")
        self.suite = dramatiq_unique.setup(
            self.broker, database=database_url, redis=REDIS_URL, key_prefix=name, redriver=False,
            lost_after=LOST_AFTER,
        )
        if options is None:
            options = {"unique_args": ["n"]} if unique else {"track": True}
        self.runs: list = []
        #: A job sent with ``hold=True`` sets ``holding`` and runs until ``release`` is set.
        self.holding, self.release = threading.Event(), threading.Event()

        def job(n: int, tag: str = "", hold: bool = False) -> int:
            if hold:
                self.holding.set()
                self.release.wait(30)
            self.runs.append(tag or n)
            return n

        self.job = dramatiq.actor(job, broker=self.broker, actor_name="job", **options)

    def use(self) -> "App":
        """Make this app's suite the one module-level functions (get_job, submit) use."""
        set_current(self.suite)
        return self

    def passes(self, n: int = 2):
        out = []
        for i in range(n):
            if i:
                threading.Event().wait(CONFIRM_AFTER / 1000 + 0.05)
            out.append(redrive(self.broker, suite=self.suite))
        return out

    def rows(self):
        return list(JobModel.select().where(JobModel.app == self.suite.app).order_by(JobModel.id))

    def close(self) -> None:
        try:
            wipe_broker(self.broker)
        except Exception:
            pass  # its Redis may be down (the test stopped it)
        self.broker.close()
        self.suite.db.close()


@pytest.fixture
def apps(database_url, key_prefix) -> Iterator[tuple[App, App]]:
    # Both key prefixes start with the test's: its fixture deletes their Redis keys.
    a = App(f"{key_prefix}-a", database_url)
    b = App(f"{key_prefix}-b", database_url)
    yield a, b
    for app in (a, b):
        app.close()


def overdue() -> None:
    threading.Event().wait(LOST_AFTER / 1000 + 0.05)


def total(counts, name: str) -> int:
    return sum(getattr(c, name) for c in counts)


def make_pending(row_id: int) -> None:
    """As an outbox row whose publish failed at commit: pending, due, never in the broker."""
    JobModel.update(status="pending", enqueued_at=None, broker_ref=None).where(JobModel.id == row_id).execute()


def reserve_elsewhere(info, group: str, app: str):
    """A reservation of the group's next row by another process ("elsewhere"), for a minute."""
    return jobs.reserve(info.model, group, info.order_by, "elsewhere:1:deck", 60_000, app=app)

def test_a_pass_never_touches_another_apps_jobs(apps):
    """Given app B's jobs in every state a pass acts on (due pending, lost from its broker,
    finished long ago), when app A runs passes, then none of them is sent, failed or
    pruned; app B's own passes then handle each of them."""
    a, b = apps
    b.use()
    due = b.job.send(1)
    lost = b.job.send(2)
    old = b.job.send(3)
    rows = {row.message_id: row for row in b.rows()}
    assert {row.app for row in rows.values()} == {b.suite.app}
    make_pending(rows[due.message_id].id)
    JobModel.update(status="succeeded", finished_at=utcnow() - timedelta(days=30)).where(
        JobModel.id == rows[old.message_id].id
    ).execute()
    wipe_broker(b.broker)  # B's broker lost every message: the "lost" job's message is gone
    overdue()
    before = [(r.id, r.status, r.revision, r.attempts, r.last_error) for r in b.rows()]

    counts = a.passes(3)
    assert all(c.ran for c in counts)
    assert sum(c.sent + c.lost + c.missing + c.failed + c.pruned + c.redriven for c in counts) == 0
    assert [(r.id, r.status, r.revision, r.attempts, r.last_error) for r in b.rows()] == before
    assert broker_messages(a.broker) == [] and broker_messages(b.broker) == []

    counts = b.passes(2)
    assert total(counts, "sent") == 1  # the due pending job
    assert total(counts, "redriven") == 1  # the lost one
    assert total(counts, "pruned") == 1  # the old finished one
    assert sorted(m["message_id"] for m in broker_messages(b.broker)) == sorted([due.message_id, lost.message_id])
    assert broker_messages(a.broker) == []


def test_each_app_runs_its_own_jobs(apps):
    """Workers of both apps on one database: each runs its own jobs only, and each job once."""
    a, b = apps
    a.use()
    sent_a = [a.job.send(n) for n in range(5)]
    b.use()
    sent_b = [b.job.send(n) for n in range(100, 105)]
    workers = [dramatiq.Worker(app.broker, worker_timeout=50, worker_threads=2) for app in apps]
    for worker in workers:
        worker.start()
    try:
        wait_until(lambda: all(r.status == "succeeded" for r in a.rows() + b.rows()), timeout=30, what="all jobs done")
        for _ in range(2):  # passes of both apps meanwhile change nothing
            a.passes(1), b.passes(1)
    finally:
        for worker in workers:
            worker.stop(timeout=10_000)
    assert sorted(a.runs) == list(range(5)) and sorted(b.runs) == list(range(100, 105))
    assert {r.message_id for r in a.rows()} == {m.message_id for m in sent_a}
    assert {r.message_id for r in b.rows()} == {m.message_id for m in sent_b}


def test_get_job_sees_only_its_own_apps_jobs(apps):
    a, b = apps
    b.use()
    message = b.job.send(1)
    row_id = b.rows()[0].id
    assert dramatiq_unique.get_job(message.message_id).app == b.suite.app
    a.use()
    assert dramatiq_unique.get_job(message.message_id) is None
    assert dramatiq_unique.get_job(row_id) is None


def test_idempotency_keys_do_not_cross_apps(apps):
    """The same (actor, owner, key) in two apps makes one job in each; each app's repeat
    returns its own job."""
    a, b = apps
    a.use()
    job_a, created_a = submit(a.job, 1, idempotency_key="req-1", owner="alice")
    b.use()
    job_b, created_b = submit(b.job, 1, idempotency_key="req-1", owner="alice")
    again_b, created_again = submit(b.job, 1, idempotency_key="req-1", owner="alice")
    a.use()
    again_a, created_again_a = submit(a.job, 1, idempotency_key="req-1", owner="alice")
    assert (created_a, created_b, created_again, created_again_a) == (True, True, False, False)
    assert job_a.id != job_b.id
    assert (job_a.app, job_b.app) == (a.suite.app, b.suite.app)
    assert (again_a.id, again_b.id) == (job_a.id, job_b.id)


def test_unique_keys_do_not_cross_apps(database_url, key_prefix):
    """Two apps with the same actor name and unique_args: a job of one never blocks, or
    stands for, a send of the other; within each app the key stays unique, under
    concurrent sends from both apps."""
    a = App(f"{key_prefix}-ua", database_url, unique=True)
    b = App(f"{key_prefix}-ub", database_url, unique=True)
    try:
        errors: list[BaseException] = []
        barrier = threading.Barrier(8)

        def send(app: App) -> None:
            try:
                barrier.wait(10)
                for n in range(5):
                    app.job.send(n)
            except BaseException as e:  # noqa: BLE001 - reported below
                errors.append(e)

        threads = [threading.Thread(target=send, args=(app,)) for app in (a, b, a, b, a, b, a, b)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not errors and not any(t.is_alive() for t in threads)
        for app in (a, b):
            rows = app.rows()
            assert sorted(r.args[0] for r in rows) == list(range(5)), app.suite.app
            assert all(r.unique_hold is not None for r in rows)
            assert len(broker_messages(app.broker)) == 5
    finally:
        a.close()
        b.close()


def test_an_actor_the_process_does_not_declare_is_left_to_a_process_that_does(database_url, key_prefix):
    """One app, two processes (here: two brokers on one namespace): a web process that
    declares only ``job`` and a worker process that declares ``job`` and ``report``.  The
    web process's passes never send, fail or prune a ``report`` job; the worker's do,
    even while the web process holds its own pass lock."""
    worker_app = App(key_prefix, database_url)
    report = dramatiq.actor(lambda n: n, broker=worker_app.broker, actor_name="report", track=True)
    web = App(key_prefix, database_url)  # the same key_prefix and namespace: the same app
    try:
        assert web.broker.namespace == worker_app.broker.namespace
        worker_app.use()
        due = report.send(1)
        lost = report.send(2)
        rows = {r.message_id: r for r in worker_app.rows()}
        make_pending(rows[due.message_id].id)
        wipe_broker(worker_app.broker)
        overdue()
        web_lock = Scope(web.suite, web.broker).lock_name()
        assert web_lock != Scope(worker_app.suite, worker_app.broker).lock_name()

        counts = web.passes(3)
        assert sum(c.sent + c.lost + c.missing + c.failed + c.redriven for c in counts) == 0
        assert {r.status for r in worker_app.rows()} == {"pending", "queued"}

        token, _ = web.suite.locks.acquire(web_lock, 5_000)  # a web pass under way
        try:
            counts = worker_app.passes(2)
        finally:
            web.suite.locks.release(web_lock, token)
        assert all(c.ran for c in counts)
        assert (total(counts, "sent"), total(counts, "redriven")) == (1, 1)
        assert sorted(m["message_id"] for m in broker_messages(worker_app.broker)) == sorted(
            [due.message_id, lost.message_id]
        )
    finally:
        web.close()
        worker_app.close()


def test_a_pass_runs_while_the_other_apps_broker_is_down(database_url, key_prefix):
    """App B's broker (its own Redis) goes down with jobs of B waiting: app A's passes run
    and handle A's jobs, and leave B's alone; B's jobs are handled once B's Redis is back."""
    server = RedisServer().start()
    a = App(f"{key_prefix}-da", database_url)
    b = App(f"{key_prefix}-db", database_url, redis_url=server.url)
    try:
        b.use()
        waiting_b = b.job.send(1)
        wipe_broker(b.broker)
        make_pending(b.rows()[0].id)
        a.use()
        waiting_a = a.job.send(2)
        wipe_broker(a.broker)  # as if its publish had failed at an outbox commit
        make_pending(a.rows()[0].id)
        server.stop()
        counts = a.passes(2)
        assert total(counts, "sent") == 1 and total(counts, "errors") == 0
        assert [m["message_id"] for m in broker_messages(a.broker)] == [waiting_a.message_id]
        assert [r.status for r in b.rows()] == ["pending"]
        counts = b.passes(1)  # B's own pass finds its broker down: the job waits
        assert (total(counts, "sent"), total(counts, "errors")) == (0, 1)
        assert [r.status for r in b.rows()] == ["pending"]
        server = RedisServer(server.port).start()
        wait_until(lambda: total(b.passes(1), "sent") == 1, timeout=10, what="B's job sent once its Redis is back")
        assert [m["message_id"] for m in broker_messages(b.broker)] == [waiting_b.message_id]
        assert [m["message_id"] for m in broker_messages(a.broker)] == [waiting_a.message_id]
    finally:
        server.stop()
        a.close()
        b.close()


# -- parked jobs (execution locks, concurrency slots) ----------------------------------------

PARKING_OPTIONS = {
    "while_executing": {"unique_args": ["n"], "unique_lock": "while_executing"},
    "concurrency_limit": {"concurrency_limit": 1},
}


def parked_row(message_id: str) -> Optional[JobModel]:
    row = JobModel.get_or_none(JobModel.message_id == message_id)
    return row if row is not None and row.parked_on else None


def untouched(row: JobModel) -> tuple:
    """What no other app may change in a parked row: a claim, a start or a deck reservation writes some."""
    return (row.app, row.status, row.parked_on, row.revision, row.attempts, row.fencing_token, row.started_at,
            row.worker, row.lease_until, row.broker_ref)


@pytest.mark.parametrize("kind", sorted(PARKING_OPTIONS))
def test_parked_jobs_are_woken_only_by_their_own_app(database_url, key_prefix, kind):
    """Given two apps whose actor ``job`` (the same name, the same arguments: the same group
    name) has a job running and one parked behind it in each app, app B's parked first, When
    app A's holder finishes (a hand-over, through the deck for a slot) and A's re-drive
    looks for orphaned groups (A's gate is free), Then A wakes, claims, reserves and runs
    only its own parked job, and B's stays parked and untouched; When B's holder finishes,
    Then B's parked job runs, in B.  B's deck is off, as if B's holder ran longer than a row
    may wait on deck (or ran in another process): B's parked row is not reserved, so only its
    app keeps it from A's claims and A's deck."""
    a = App(f"{key_prefix}-pa", database_url, options=PARKING_OPTIONS[kind])
    b = App(f"{key_prefix}-pb", database_url, options=PARKING_OPTIONS[kind])
    workers = {app: dramatiq.Worker(app.broker, worker_timeout=50, worker_threads=2) for app in (a, b)}
    try:
        b.use()
        lot.of(b.suite).ondeck.enabled = False
        workers[b].start()
        b.job.send(1, tag="b-hold", hold=True)
        wait_until(b.holding.is_set, timeout=10, what="B's holder to start")
        waiting_b = b.job.send(1, tag="b-parked")
        row_b = wait_until(lambda: parked_row(waiting_b.message_id), timeout=10, what="B's job parked")
        before = untouched(row_b)

        a.use()
        workers[a].start()
        a.job.send(1, tag="a-hold", hold=True)
        wait_until(a.holding.is_set, timeout=10, what="A's holder to start")
        waiting_a = a.job.send(1, tag="a-parked")
        row_a = wait_until(lambda: parked_row(waiting_a.message_id), timeout=10, what="A's job parked")
        assert row_a.parked_on == row_b.parked_on, "the same group name in both apps"
        a.release.set()
        wait_until(lambda: JobModel.get_by_id(row_a.id).status == "succeeded", timeout=15, what="A's parked job")
        assert a.runs == ["a-hold", "a-parked"]
        assert untouched(JobModel.get_by_id(row_b.id)) == before

        counts = a.passes(1)  # A's gate of the group is free: only B's row is parked on it
        assert counts[0].ran and counts[0].woken == 0
        assert untouched(JobModel.get_by_id(row_b.id)) == before
        assert a.runs == ["a-hold", "a-parked"] and b.runs == []

        b.use()
        b.release.set()
        wait_until(lambda: JobModel.get_by_id(row_b.id).status == "succeeded", timeout=15, what="B's parked job")
        assert b.runs == ["b-hold", "b-parked"] and a.runs == ["a-hold", "a-parked"]
        assert {r.status for r in a.rows() + b.rows()} == {"succeeded"}
        assert [r.attempts for r in a.rows() + b.rows()] == [1, 1, 1, 1]
    finally:
        a.release.set()
        b.release.set()
        for worker in workers.values():
            worker.stop(timeout=10_000)
        a.close()
        b.close()


def test_parking_statements_see_only_their_apps_rows(database_url, key_prefix):
    """Given rows of two apps parked on one slot group, app B's first in the queue: A's
    orphan wake-up, claim, deck reservation, "anyone waiting?" and concurrency_status()
    see only A's rows; B's are left as they were."""
    a = App(f"{key_prefix}-sa", database_url, options=PARKING_OPTIONS["concurrency_limit"])
    b = App(f"{key_prefix}-sb", database_url, options=PARKING_OPTIONS["concurrency_limit"])
    try:
        group = "slot:job:all"

        def park(app: App, n: int, age_ms: int) -> JobModel:
            message = app.job.message(n)
            return JobModel.create(message_id=message.message_id, app=app.suite.app, actor_name="job",
                                   queue_name="default", args=[n], status="pending", parked_on=group,
                                   created_at=after_ms(-age_ms))

        b_rows = [park(b, n, 60_000 - n) for n in range(3)]
        before = [untouched(r) for r in b_rows]

        def b_untouched() -> bool:
            return [untouched(JobModel.get_by_id(r.id)) for r in b_rows] == before

        a.use()
        info = gate_of(a.suite).describe(group)
        assert lot.of(a.suite).wake_orphans() == 0 and broker_messages(a.broker) == []
        assert jobs.claim_parked(JobModel, group, "created_at", utcnow(), "ref", app=a.suite.app) is None
        assert reserve_elsewhere(info, group, a.suite.app) is None
        assert lot.waiting_in(info, group, app=a.suite.app) is None
        assert concurrency_status("job").parked == 0
        assert b_untouched()

        a_rows = [park(a, n, 1_000 - n) for n in range(10, 13)]
        assert concurrency_status("job").parked == 3
        assert lot.waiting_in(info, group, app=a.suite.app) == 0
        reserved = reserve_elsewhere(info, group, a.suite.app)
        assert reserved is not None and reserved.id == a_rows[0].id
        claimed = jobs.claim_parked(JobModel, group, "created_at", utcnow(), "ref", app=a.suite.app)
        assert claimed is not None and claimed.id == a_rows[1].id
        assert lot.of(a.suite).wake_orphans() == 1  # the last of A's: its slot is free
        assert [m["message_id"] for m in broker_messages(a.broker)] == [a_rows[2].message_id]
        assert b_untouched()
        b.use()
        assert concurrency_status("job").parked == 3
    finally:
        a.close()
        b.close()


def test_parking_statements_use_the_app_and_group_index_on_postgresql(pg_url, key_prefix, monkeypatch):
    """Given another app's backlog of 20,000 jobs parked on the same group, 5,000 of this app's
    parked on another group and 30,000 finished ones, every statement of a hand-over, a deck
    reservation, an orphan wake-up and concurrency_status() starts from an index, the group's
    ones from ``(app, parked_on, created_at)``: neither another app's queue nor another group's
    costs a hand-over anything.  The claim and the reservation are prepared statements: their
    generic plan (the one a connection may keep) is checked."""
    app = App(f"{key_prefix}-ix", pg_url, options=PARKING_OPTIONS["concurrency_limit"])
    db = app.suite.db
    group, table = "slot:job:all", JobModel._meta.table_name
    try:
        bulk_insert_pg(JobModel, 20_000, status="pending", prefix="theirs", actor_name="job")
        db.execute_sql(f'UPDATE "{table}" SET "app" = %s, "parked_on" = %s', ["another-app", group])
        bulk_insert_pg(JobModel, 5_000, status="pending", prefix="hot", actor_name="job")
        db.execute_sql(f'UPDATE "{table}" SET "parked_on" = %s WHERE "app" = %s', ["slot:job:hot", ""])
        bulk_insert_pg(JobModel, 30_000, status="succeeded", prefix="done", actor_name="job")
        db.execute_sql(f'UPDATE "{table}" SET "app" = %s WHERE "app" = %s', [app.suite.app, ""])
        for n in range(3):
            JobModel.create(message_id=f"mine-{n}", app=app.suite.app, actor_name="job", queue_name="default",
                            args=[n], status="pending", parked_on=group)
        db.execute_sql(f'ANALYZE "{table}"')
        app.use()

        statements: list[tuple[Any, Any]] = []
        run_prepared, run_sql = queries.execute, db.execute_sql

        def recording_prepared(database, query, params):
            statements.append((query, dict(params)))
            return run_prepared(database, query, params)

        def recording_sql(sql, params=None, *args, **kwargs):
            if sql.lstrip().upper().startswith("SELECT"):
                statements.append((sql, list(params or ())))
            return run_sql(sql, params, *args, **kwargs)

        monkeypatch.setattr(queries, "execute", recording_prepared)
        monkeypatch.setattr(db, "execute_sql", recording_sql)
        info = gate_of(app.suite).describe(group)
        assert reserve_elsewhere(info, group, app.suite.app).message_id == "mine-0"
        claimed = jobs.claim_parked(JobModel, group, "created_at", utcnow(), "ref", app=app.suite.app)
        assert claimed is not None
        assert lot.waiting_in(info, group, app=app.suite.app) == 0
        assert concurrency_status("job").parked == 2
        assert lot.of(app.suite).wake_orphans() == 2  # the last of the group, and the head of the hot one
        monkeypatch.undo()

        explained, generic = 0, 0
        db.execute_sql("SET plan_cache_mode = force_generic_plan")
        try:
            for query, params in statements:
                if isinstance(query, queries.Query):  # as the connection runs it: EXECUTE of its prepared statement
                    body = query.sql
                    plan_rows = db.execute_sql("EXPLAIN " + query.execute_sql, params).fetchall()
                    generic += 1
                else:
                    body = query
                    plan_rows = db.execute_sql("EXPLAIN " + body, params).fetchall()
                plan = "\n".join(row[0] for row in plan_rows)
                assert "Seq Scan" not in plan, f"{body}\n{plan}"
                if '"parked_on" = ' in body:
                    assert "jobmodel_app_parked_on_created_at" in plan, f"{body}\n{plan}"
                explained += 1
        finally:
            db.execute_sql("RESET plan_cache_mode")
        assert explained >= 5 and generic >= 3  # the reservation, the claim, the orphans' claims
    finally:
        app.close()


def test_an_empty_key_prefix_is_refused_at_setup_before_the_broker_changes(database_url, key_prefix):
    """An app named "" would write rows that look written before rows had an app: another app's
    re-drive adopts those, and its dead set, retry_job and cancel_job see them.  setup() refuses
    the prefix with a clear error, and leaves the broker as it was."""
    broker = RedisBroker(url=REDIS_URL, namespace=f"{key_prefix}-empty")
    try:
        before = list(broker.middleware)
        with pytest.raises(InvalidOption, match="key_prefix must be a non-empty str"):
            dramatiq_unique.setup(broker, database=database_url, redis=REDIS_URL, key_prefix="", redriver=False)
        assert broker.middleware == before
    finally:
        broker.close()
