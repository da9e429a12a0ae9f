"""The ops layer (dramatiq_unique.ops) on real Redis and SQLite/PostgreSQL."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from dramatiq_unique import JobNotFound, ops
from dramatiq_unique.ops import keys
from dramatiq_unique.storage.models import utcnow


def test_the_views_of_a_busy_scene(suite, scene):
    """Given two webhooks of customer 42 running and three parked, a report of user 7 running and two
    parked, When an operator looks, Then every view names the holders, the waiters and the key in words."""
    page = ops.jobs(suite)
    assert [row.id for row in page.rows] == sorted(range(1, 11), reverse=True) and page.cursor is None
    assert {row.key for row in page.rows if row.actor == "deliver_webhook"} == {"customer=42"}
    json.dumps(page.as_dict())

    last = scene.slot_waiters[-1]
    holders = " and ".join(str(i) for i in scene.slot_holders)
    assert ops.job(suite, last).why == (
        f"waiting for a slot of deliver_webhook customer=42: 2 of 2 held by jobs {holders}; 2 waiting ahead")
    view = ops.job(suite, scene.lock_waiters[-1])
    assert view.why.startswith(f"waiting for the execution lock of report user=7: held by job {scene.lock_holder} "
                               f"(token 1, "), view.why
    assert view.why.endswith("s left); 1 waiting ahead")
    json.dumps(view.as_dict())

    [lock] = ops.locks(suite)
    assert (lock.kind, lock.key, lock.holder, lock.token, lock.waiters) == (
        "run", "user=7", scene.lock_holder, 1, scene.lock_waiters)
    assert 0 < lock.left_ms <= 30_000
    [group] = ops.slots(suite)
    assert (group.key, group.limit, group.held, group.holders, group.waiters, group.halted) == (
        "customer=42", 2, 2, scene.slot_holders, scene.slot_waiters, False)

    stats = ops.stats(suite)
    assert stats.by_status == {"pending": 5, "running": 3, "failed": 1, "succeeded": 1}
    assert stats.by_actor["deliver_webhook"] == {"pending": 3, "running": 2}
    assert sum(stats.throughput) == 2 and stats.running_ms["p50"] is not None
    json.dumps(stats.as_dict())


def test_filters_and_pages(suite, scene):
    """Filters by key (hashed back to unique keys, or matched on the row), status and actor, and
    pages of two that together give the whole list once."""
    assert [r.id for r in ops.jobs(suite, key="customer=42").rows] == sorted(
        scene.slot_holders + scene.slot_waiters, reverse=True)
    assert [r.id for r in ops.jobs(suite, key="user=7").rows] == sorted(
        [scene.lock_holder, *scene.lock_waiters], reverse=True)
    assert ops.jobs(suite, key="customer=43").rows == []
    assert [r.id for r in ops.jobs(suite, status="failed").rows] == [scene.dead]
    assert [r.id for r in ops.jobs(suite, status="failed,succeeded", actor="fine").rows] == [scene.done]
    now = utcnow()
    assert len(ops.jobs(suite, since=now - timedelta(hours=1)).rows) == 10
    assert ops.jobs(suite, since=now + timedelta(hours=1)).as_dict() == {"rows": [], "cursor": None, "down": []}
    seen, cursor = [], None
    for _ in range(10):
        page = ops.jobs(suite, limit=2, cursor=cursor)
        seen += [r.id for r in page.rows]
        cursor = page.cursor
        if cursor is None:
            break
    assert seen == list(range(10, 0, -1))
    with pytest.raises(ValueError):
        ops.jobs(suite, cursor="garbage")
    with pytest.raises(ValueError):
        ops.jobs(suite, status="nope")
    with pytest.raises(JobNotFound):
        ops.job(suite, 999_999)


def test_a_key_matched_on_the_rows_is_found_behind_many_that_only_look_alike(suite, broker, scene):
    """Rows whose arguments hold the key's value but not as the key (60 newer ``fine(42)`` jobs, more
    than a page) do not hide the jobs whose key it is: the SQL sieve's rows are read in batches."""
    fine = broker.get_actor("fine")
    for _ in range(60):
        fine.send(42)
    webhooks = sorted(scene.slot_holders + scene.slot_waiters, reverse=True)
    assert keys.derived(suite, None, "customer=42") is None  # a slot group's key: matched on the rows
    seen, cursor = [], None
    for _ in range(5):
        page = ops.jobs(suite, key="customer=42", limit=2, cursor=cursor)
        seen += [r.id for r in page.rows]
        cursor = page.cursor
        if cursor is None:
            break
    assert seen == webhooks
    # unique_args naming the words: the index, whatever other actors there are; words no actor has: nothing.
    assert keys.derived(suite, None, "user=7") is not None
    assert [r.id for r in ops.jobs(suite, key="user=7").rows] == sorted(
        [scene.lock_holder, *scene.lock_waiters], reverse=True)
    assert keys.derived(suite, None, "nobody=1") == ()
    assert ops.jobs(suite, key="nobody=1").rows == []


def test_keys_from_defaults_callables_and_strings_are_found(suite, broker, scene):
    """A key value the send took from a default (so not in the stored arguments), a key callable's
    text, and "42" sent as a string are all found by their words."""
    import dramatiq

    @dramatiq.actor(concurrency_key=["region"])
    def tagged(n, region="eu"):
        pass

    @dramatiq.actor(unique_args=lambda n, **_: f"n-{n}", unique_lock="until_executing", track=True)
    def named(n):
        pass

    first, _, third = tagged.send(1), tagged.send(2, region="us"), tagged.send("42", region="eu")
    message = named.send(5)
    found = {r.message_id for r in ops.jobs(suite, key="region=eu", actor="tagged").rows}
    assert found == {first.message_id, third.message_id}
    assert [r.message_id for r in ops.jobs(suite, key="n-5").rows] == [message.message_id]
    assert [r.key for r in ops.jobs(suite, actor="named").rows] == ["n-5"]


def test_a_waiting_job_s_queue_lock_is_listed_with_its_holder(suite, broker):
    import dramatiq

    @dramatiq.actor(unique_args=["user"], unique_lock="until_executing")
    def digest(user):
        pass

    message = digest.send_with_options(args=(3,), delay=60_000)
    [lock] = ops.locks(suite)
    assert (lock.kind, lock.actor, lock.key, lock.holder_message_id, lock.token) == (
        "queue", "digest", "user=3", message.message_id, None)
    assert lock.left_ms > 0
    view = ops.job(suite, message.message_id)
    assert view.why.startswith("due in ") and view.key == "user=3"
