"""A unique send's row or its holder in one statement (jobs.insert_or_holder, jobs.insert_holding),
on SQLite and on a real PostgreSQL."""

from __future__ import annotations

import threading
from typing import Iterator
from urllib.parse import unquote

import peewee as pw
import psycopg2
import pytest

import dramatiq_unique
from dramatiq_unique import JobModel
from dramatiq_unique.storage import jobs
from dramatiq_unique.storage.database import is_postgres
from tests.conftest import REDIS_URL
from tests.helpers import wait_until


@pytest.fixture(params=["plain", "one statement"])
def insert_kind(request, monkeypatch) -> str:
    """jobs.insert_holding either way (storage/jobs.py chooses by the actor's recent clashes)."""
    monkeypatch.setattr(jobs, "expect_holder", lambda actor_name: request.param == "one statement")
    return request.param


def fields(message_id: str, app: str = "", **more) -> dict:
    return {"app": app, "message_id": message_id, "actor_name": "report", "queue_name": "default",
            "unique_key": "report:1", **more}


def test_a_new_hold_is_inserted_and_a_held_one_answers_its_holder(suite):
    first, none = jobs.insert_or_holder(JobModel, {**fields("m1"), "unique_hold": "report:1"})
    assert first is not None and none is None

    if not is_postgres(suite.db):  # no round trip to save: the clash raises, as a plain INSERT's
        with pytest.raises(pw.IntegrityError):
            jobs.insert_or_holder(JobModel, {**fields("m2"), "unique_hold": "report:1"})
        return
    row_id, holder = jobs.insert_or_holder(JobModel, {**fields("m2"), "unique_hold": "report:1"})
    assert row_id is None
    assert (holder.id, holder.message_id, holder.status) == (first, "m1", "queued")
    assert holder.created_at is not None
    assert JobModel.select().count() == 1  # nothing written for the refused one


@pytest.mark.parametrize("kind", ["holder", "message id"])
def test_only_the_hold_is_the_arbiter(suite, kind):
    """Another unique column's clash still raises, as a plain INSERT's does (the callers rely on it)."""
    jobs.insert_or_holder(JobModel, {**fields("m1"), "unique_hold": "report:1"})
    with pytest.raises(pw.IntegrityError):
        jobs.insert_or_holder(JobModel, {**fields("m1"), "unique_hold": "report:2"})


def test_apps_do_not_share_holds(suite):
    a, _ = jobs.insert_or_holder(JobModel, {**fields("m1", app="a"), "unique_hold": "report:1"})
    b, _ = jobs.insert_or_holder(JobModel, {**fields("m2", app="b"), "unique_hold": "report:1"})
    assert a is not None and b is not None and a != b


def test_an_idempotency_key_held_elsewhere_still_wins_over_the_unique_hold(suite, insert_kind):
    jobs.insert_holding(JobModel, fields("m1", idempotency_key="k", idempotency_hold="report::k"), "report:1", None)
    with pytest.raises(jobs.IdempotencyHeld):
        jobs.insert_holding(JobModel, fields("m2", idempotency_key="k", idempotency_hold="report::k"), "report:1", None)
    # Another key: the unique hold's holder answers.
    row_id, holder = jobs.insert_holding(
        JobModel, fields("m3", idempotency_key="k2", idempotency_hold="report::k2"), "report:1", None
    )
    assert row_id is None and holder.message_id == "m1"


@pytest.fixture
def pg_suite(broker, pg_url, key_prefix) -> Iterator[dramatiq_unique.Suite]:
    suite = dramatiq_unique.setup(broker, database=pg_url, redis=REDIS_URL, key_prefix=key_prefix, redriver=False)
    yield suite
    suite.db.close()


def test_a_holder_that_commits_while_the_insert_waits_is_found(pg_suite, pg_url, insert_kind):
    """The holder's row is written in a transaction still open when the insert runs: PostgreSQL makes the
    insert wait for it; after the commit the plain INSERT fails on the index, and the one statement finds
    the row outside its snapshot.  Either way the send resolves to it (a second read), and no second row
    is written."""
    schema = unquote(pg_url).split("search_path=")[1]
    other = psycopg2.connect(dbname="test", host="127.0.0.1", user="postgres", options=f"-csearch_path={schema}")
    try:
        with other.cursor() as cur:  # psycopg2 opens a transaction: the row stays uncommitted
            cur.execute(
                "INSERT INTO dramatiq_unique_jobs (app, message_id, actor_name, queue_name, args, kwargs, options,"
                " unique_key, unique_hold, status, attempts, revision, fencing_token, created_at) VALUES ('', 'm1',"
                " 'report', 'default', '[]', '{}', '{}', 'report:1', 'report:1', 'queued', 0, 0, 0,"
                " now() AT TIME ZONE 'utc')"
            )
        got: list = []
        waiter = threading.Thread(
            target=lambda: got.append(jobs.insert_holding(JobModel, fields("m2"), "report:1", None))
        )
        waiter.start()
        watch = psycopg2.connect(dbname="test", host="127.0.0.1", user="postgres")
        watch.autocommit = True
        try:
            with watch.cursor() as cur:

                def waiting() -> bool:
                    cur.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                                " AND pid <> pg_backend_pid() AND backend_type = 'client backend'")
                    return cur.fetchone()[0] >= 1

                wait_until(waiting, timeout=10, what="the insert waiting for the open transaction")
        finally:
            watch.close()
        other.commit()
        waiter.join(10)
        assert not waiter.is_alive()
    finally:
        other.close()
    row_id, holder = got[0]
    assert row_id is None and holder.message_id == "m1"
    assert JobModel.select().count() == 1


def test_an_actor_whose_keys_are_often_held_switches_to_the_one_statement_and_back(suite, monkeypatch):
    monkeypatch.setattr(jobs, "_share", {})
    used: list[str] = []
    original = jobs.insert_or_holder

    def spy(model, values, read_holder=True):
        if read_holder:
            used.append(values["message_id"])
        return original(model, values, read_holder)

    monkeypatch.setattr(jobs, "insert_or_holder", spy)
    jobs.insert_holding(JobModel, fields("holder"), "report:1", None)
    for n in range(6):  # duplicates from "another process": refused each time
        row_id, holder = jobs.insert_holding(JobModel, fields(f"dup{n}"), "report:1", None)
        assert row_id is None and holder.message_id == "holder"
    assert used == ["dup4", "dup5"]  # four refusals in a row switch it
    for n in range(40):  # new keys: back to the plain INSERT
        jobs.insert_holding(JobModel, {**fields(f"new{n}"), "unique_key": f"report:{n + 2}"}, f"report:{n + 2}", None)
    assert not jobs.expect_holder("report")
