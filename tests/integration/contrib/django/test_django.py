"""dramatiq_unique.contrib.django: sends in ``transaction.atomic()`` commit and roll back with the view's
writes, on Django's connection; ``migrate`` makes the tables; the dashboard is behind Django's login.

PostgreSQL, real Redis brokers (the shared server, or one the test stops), django_dramatiq's settings.
A Group stands for the view's own model (an Order).
"""

from __future__ import annotations

import re

import dramatiq
import pytest
from django.contrib.auth.models import Group, User
from django.core.management import CommandError, call_command
from django.db import connection, transaction
from django.test import Client
from django_dramatiq.utils import load_middleware
from dramatiq.brokers.redis import RedisBroker

import dramatiq_unique
from dramatiq_unique.contrib.django.apps import setup
from dramatiq_unique.storage import schema
from dramatiq_unique.storage.models import JobModel
from tests.durable import RedisServer, running_worker
from tests.helpers import job_of, wait_until
from tests.integration.contrib import published, race
from tests.integration.contrib.django.conftest import DRAMATIQ_MIDDLEWARE


@pytest.fixture
def charge(dj_suite):
    @dramatiq.actor(track=True)
    def charge(order: str) -> str:
        return order

    return charge


def test_the_job_rows_are_written_on_djangos_connection_in_its_transaction(dj_suite, dj_broker, charge):
    with transaction.atomic():
        Group.objects.create(name="order-1")
        message = charge.send("order-1")
        assert job_of(message).status == "pending"  # read through the same connection, in the transaction
        assert message.message_id not in published(dj_broker)
    assert job_of(message).status == "queued"
    assert published(dj_broker) == {message.message_id}


def test_a_rollback_publishes_nothing_and_leaves_no_row(dj_suite, dj_broker, charge):
    with pytest.raises(RuntimeError), transaction.atomic():
        Group.objects.create(name="order-2")
        message = charge.send("order-2")
        raise RuntimeError("the view failed")
    assert not Group.objects.filter(name="order-2").exists()
    assert dramatiq_unique.get_job(message.message_id) is None
    assert published(dj_broker) == set()


def test_a_rolled_back_savepoint_drops_its_sends_and_keeps_the_rest(dj_suite, dj_broker, charge):
    untracked = dramatiq.actor(lambda order: order, actor_name="untracked")
    with transaction.atomic():
        kept = charge.send("kept")
        with pytest.raises(RuntimeError), transaction.atomic():
            dropped = charge.send("dropped")
            dropped_untracked = untracked.send("dropped")
            with transaction.atomic():  # released into the savepoint that rolls back: dropped with it
                dropped_inner = charge.send("dropped-inner")
            raise RuntimeError
        with transaction.atomic():
            released = charge.send("released")
        sid = transaction.savepoint()
        after = charge.send("after-manual-savepoint")
        transaction.savepoint_rollback(sid)  # Django's on_commit does not follow it; the row's claim does
    assert published(dj_broker) == {kept.message_id, released.message_id}
    for message in (dropped, dropped_inner, after):
        assert dramatiq_unique.get_job(message.message_id) is None
    assert dropped_untracked.message_id not in published(dj_broker)


def test_dramatiq_uniques_own_transaction_block_is_djangos_atomic(dj_suite, dj_broker, charge):
    with dramatiq_unique.transaction():
        assert connection.in_atomic_block
        message = charge.send("block")
        assert message.message_id not in published(dj_broker)
    assert published(dj_broker) == {message.message_id}


def test_outside_any_transaction_a_send_is_published_at_once(dj_suite, dj_broker, charge):
    assert connection.get_autocommit()
    message = charge.send("autocommit")
    assert published(dj_broker) == {message.message_id}
    assert job_of(message).status == "queued"


def test_a_broker_down_at_commit_leaves_the_job_pending_for_the_redrive(migrated, key_prefix):
    server = RedisServer().start()
    broker = RedisBroker(url=server.url, namespace=f"{key_prefix}-down",
                         middleware=[load_middleware(path) for path in DRAMATIQ_MIDDLEWARE])
    dramatiq.set_broker(broker)
    setup(broker, key_prefix=key_prefix)
    try:
        @dramatiq.actor(track=True)
        def charge(order: str) -> str:
            return order

        with transaction.atomic():
            Group.objects.create(name="order-down")
            message = charge.send("order-down")
            server.stop()  # gone when the view commits
        assert Group.objects.filter(name="order-down").exists()
        assert job_of(message).status == "pending"
        server.start()
        assert dramatiq_unique.redrive().sent == 1
        assert published(broker) == {message.message_id}
        with running_worker(broker):
            wait_until(lambda: job_of(message).status == "succeeded", timeout=10)
    finally:
        server.stop()
        broker.close()
        Group.objects.filter(name="order-down").delete()


def test_two_racing_requests_make_one_job(dj_suite, dj_broker):
    @dramatiq.actor(unique_args=["order"], unique_lock="until_executed")
    def invoice(order: str) -> str:
        return order

    def request(name: str, sent) -> str:
        try:
            with transaction.atomic():
                Group.objects.create(name=f"race-{name}")
                message = invoice.send("order-7")
                sent()
            return message.message_id
        finally:
            connection.close()

    results = race(request)
    assert results["a"] == results["b"]
    assert JobModel.select().where((JobModel.actor_name == "invoice") & (JobModel.app == dj_suite.app)).count() == 1
    assert published(dj_broker) == {results["a"]}


def test_a_worker_runs_the_jobs_on_djangos_connections(dj_suite, dj_broker, charge):
    with transaction.atomic():
        messages = [charge.send(f"w{n}") for n in range(5)]
    with running_worker(dj_broker):
        wait_until(lambda: all(job_of(m).status == "succeeded" for m in messages), timeout=10)


def test_migrate_made_the_tables_at_the_current_version(dj_suite):
    # 0003_partial_hold_index brings the tables to version 5: a new version needs a migration that runs the step again.
    assert schema.CURRENT_VERSION == 5, "add a migration to dramatiq_unique/contrib/django/migrations"
    assert schema.version_of(JobModel) == schema.CURRENT_VERSION
    call_command("migrate", "dramatiq_unique", "zero", verbosity=0)  # the tables stay (no reverse step)
    call_command("migrate", "dramatiq_unique", verbosity=0)  # idempotent
    assert schema.version_of(JobModel) == schema.CURRENT_VERSION


def test_the_dashboard_is_refused_without_login_and_shown_to_staff(dj_suite, charge):
    message = charge.send("shown")
    client = Client()
    refused = client.get("/admin/jobs/")
    assert refused.status_code == 302 and "/admin/login/" in refused["Location"]
    user = User.objects.create_user("clerk", password="pw")  # not staff
    client.force_login(user)
    assert client.get("/admin/jobs/").status_code == 302
    user.is_staff = True
    user.save()
    page = client.get("/admin/jobs/")
    assert page.status_code == 200
    assert b"charge" in page.content
    detail = client.get(f"/admin/jobs/jobs/{message.message_id}")
    assert detail.status_code == 200 and message.message_id.encode() in detail.content
    token = re.search(rb'name="csrf_token" value="([0-9a-f]+)"', detail.content)
    assert token is not None
    cancelled = client.post(f"/admin/jobs/jobs/{message.message_id}/cancel", {"csrf_token": token[1].decode()})
    assert cancelled.status_code in (302, 303), cancelled.content
    assert job_of(message).status == "cancelled"
    user.delete()


def test_the_command_line_is_a_management_command(dj_suite, charge, capsys):
    message = charge.send("cli")
    call_command("dramatiq_unique", "job", message.message_id)
    assert message.message_id in capsys.readouterr().out
    call_command("dramatiq_unique", "jobs", "--status", "queued", "--json")
    assert message.message_id in capsys.readouterr().out
    with pytest.raises(CommandError, match="exit code 1"):
        call_command("dramatiq_unique", "job", "no-such-job")


def test_djangos_testcase_runs_the_commit_hooks_with_capture_on_commit_callbacks(dj_suite, dj_broker, charge):
    """Inside a TestCase's transaction (never committed), captureOnCommitCallbacks(execute=True) publishes."""
    from django.test import TestCase

    untracked = dramatiq.actor(lambda order: order, actor_name="untracked_tc")
    with pytest.raises(RuntimeError), transaction.atomic():  # the test's transaction, rolled back at its end
        with TestCase.captureOnCommitCallbacks(execute=True) as hooks:
            tracked = charge.send("tc")
            plain = untracked.send("tc")
        assert len(hooks) == 1
        assert published(dj_broker) == {tracked.message_id, plain.message_id}
        raise RuntimeError


def test_a_duplicate_refused_inside_atomic_leaves_the_transaction_usable(dj_suite, dj_broker):
    @dramatiq.actor(unique_args=["order"], unique_lock="until_executed", unique_on_conflict="raise")
    def invoice(order: str) -> str:
        return order

    with transaction.atomic():
        first = invoice.send("o9")
        with pytest.raises(dramatiq_unique.DuplicateJob):
            invoice.send("o9")
        Group.objects.create(name="after-duplicate")  # the clash aborted only its own savepoint
    assert published(dj_broker) == {first.message_id}
    assert Group.objects.filter(name="after-duplicate").exists()


def test_a_replace_rolled_back_keeps_the_jobs_earlier_arguments(dj_suite, dj_broker):
    @dramatiq.actor(unique_args=["order"], unique_lock="until_executing", unique_on_conflict="replace")
    def invoice(order: str, total: int) -> int:
        return total

    first = invoice.send("o10", 1)
    with pytest.raises(RuntimeError), transaction.atomic():
        invoice.send("o10", 2)
        raise RuntimeError
    with transaction.atomic():
        with pytest.raises(RuntimeError), transaction.atomic():
            invoice.send("o10", 3)
            raise RuntimeError
        replaced = invoice.send("o10", 4)
    assert replaced.message_id == first.message_id
    with running_worker(dj_broker):
        wait_until(lambda: job_of(first).status == "succeeded", timeout=10)
    assert job_of(first).result == 4


def test_a_job_that_sends_in_atomic_on_the_worker_publishes_at_its_commit(dj_suite, dj_broker, charge):
    @dramatiq.actor(track=True)
    def place(name: str) -> None:
        with transaction.atomic():
            Group.objects.create(name=name)
            charge.send(name)

    first = place.send("from-worker")
    with running_worker(dj_broker):
        wait_until(lambda: job_of(first).status == "succeeded", timeout=10)
        wait_until(lambda: JobModel.select().where((JobModel.actor_name == "charge") & (JobModel.app == dj_suite.app)
                                                   & (JobModel.status == "succeeded")).count() == 1, timeout=10)
    Group.objects.filter(name="from-worker").delete()


def test_a_send_outside_atomic_reconnects_after_its_connection_died(dj_suite, dj_broker, charge):
    import psycopg2

    from tests.conftest import PG_URL

    charge.send("before")
    raw = connection.connection
    pid = raw.info.backend_pid if hasattr(raw, "info") else raw.get_backend_pid()  # psycopg 3 or psycopg2
    killer = psycopg2.connect(PG_URL)
    killer.autocommit = True
    killer.cursor().execute("SELECT pg_terminate_backend(%s)", (pid,))
    killer.close()
    message = charge.send("after")  # the dead connection is replaced, the statement run again
    assert job_of(message).status == "queued"



def test_send_many_in_atomic_is_held_with_the_transaction(dj_suite, dj_broker, charge):
    with pytest.raises(RuntimeError), transaction.atomic():
        dramatiq_unique.send_many(charge, [((f"r{n}",), {}) for n in range(20)])
        raise RuntimeError
    assert published(dj_broker) == set()
    with transaction.atomic():
        messages = dramatiq_unique.send_many(charge, [((f"c{n}",), {}) for n in range(20)])
        assert published(dj_broker) == set()
    assert published(dj_broker) == {m.message_id for m in messages}


@pytest.mark.parametrize(("disabled_cursors", "setting", "prepared"),
                         [(False, None, True), (True, None, False), (True, True, True), (False, False, False)])
def test_djangos_setting_for_a_transaction_pooler_turns_prepared_statements_off(
        migrated, dj_broker, key_prefix, monkeypatch, disabled_cursors, setting, prepared):
    """Given DISABLE_SERVER_SIDE_CURSORS (Django's setting behind a pooler in transaction mode), Then the
    suite prepares nothing on Django's connection unless ``prepared_statements=True`` says so."""
    from django.db import connections

    from dramatiq_unique.storage import queries

    monkeypatch.setitem(connections.settings["default"], "DISABLE_SERVER_SIDE_CURSORS", disabled_cursors)
    suite = setup(dj_broker, key_prefix=key_prefix, prepared_statements=setting)
    try:
        assert getattr(suite.db, queries._ON) is prepared

        @dramatiq.actor(track=True)
        def pooled(n: int) -> None:
            pass

        first = pooled.send(1)
        with transaction.atomic():
            second = pooled.send(2)
        assert job_of(first).status == job_of(second).status == "queued"
        names = {n for (n,) in suite.db.execute_sql("SELECT name FROM pg_prepared_statements").fetchall()}
        assert bool(names) is prepared
    finally:
        connections.close_all()


def test_a_statement_gone_from_djangos_connection_turns_preparing_off(dj_suite, dj_broker, charge, caplog):
    """Given a send prepared on Django's connection, When its prepared statements are gone under it (as
    behind a pooler in transaction mode that nothing told the suite of), Then the next sends are recorded
    unprepared, with a warning, in and out of ``atomic()``."""
    import logging

    from dramatiq_unique.storage import queries

    charge.send("prepared")
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_prepared_statements")
        assert cursor.fetchone()[0] > 0
        cursor.execute("DEALLOCATE ALL")
    with caplog.at_level(logging.WARNING, logger="dramatiq_unique.storage.queries"):
        after = charge.send("after")
    assert "pooler in transaction mode" in caplog.text
    assert getattr(dj_suite.db, queries._ON) is False
    with transaction.atomic():
        inside = charge.send("inside")
    assert job_of(after).status == job_of(inside).status == "queued"
