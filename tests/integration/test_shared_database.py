"""Several apps on one database (guarantee 7, issue 12 item 9), on SQLite and PostgreSQL.

Two apps in one process: each its own RedisBroker namespace and suite
``key_prefix``, both on the test's one database.  Both declare an actor
named ``job``, so that only the rows' app tells their jobs apart.
"""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Iterator

import dramatiq
import pytest
from dramatiq.brokers.redis import RedisBroker

import dramatiq_unique
from dramatiq_unique import JobModel, submit
from dramatiq_unique.config import set_current
from dramatiq_unique.models import utcnow
from dramatiq_unique.redrive import redrive
from dramatiq_unique.scope import Scope
from tests.conftest import REDIS_URL
from tests.durable import CONFIRM_AFTER, RedisServer, broker_messages, wipe_broker
from tests.helpers import wait_until

LOST_AFTER = 100  # ms


class App:
    """One app: its broker (own namespace), its suite (own key_prefix) and its actors."""

    def __init__(self, name: str, database_url: str, *, redis_url: str = REDIS_URL, unique: bool = False) -> None:
        self.broker = RedisBroker(url=redis_url, namespace=f"{name}-broker")
        self.suite = dramatiq_unique.setup(
            self.broker, database=database_url, redis=REDIS_URL, key_prefix=name, redriver=False,
            lost_after=LOST_AFTER,
        )
        options = {"unique_args": ["n"]} if unique else {"track": True}
        self.runs: list[int] = []

        def job(n: int) -> int:
            self.runs.append(n)
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
