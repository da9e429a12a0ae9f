"""Keys and why a job waits, in words (dramatiq_unique.ops.words): no service."""

from __future__ import annotations

import time
from datetime import datetime, timedelta
from types import SimpleNamespace

import pytest

from dramatiq_unique.ops import words
from dramatiq_unique.ops.views import Waiting
from dramatiq_unique.ops.words import duration, job_list, why
from dramatiq_unique.storage.models import JobModel
from dramatiq_unique.suite import ActorConfig


@pytest.mark.parametrize("ms, text", [
    (None, "?"), (-5, "0 ms"), (850, "850 ms"), (41_000, "41 s"), (75_000, "75 s"), (180_000, "3 m"),
    (7_200_000, "2 h"), (4 * 86_400_000, "4 d"),
])
def test_durations_in_one_unit(ms, text):
    assert duration(ms) == text


def test_job_lists():
    assert job_list([12], 1) == "job 12"
    assert job_list([17, 23], 2) == "jobs 17 and 23"
    assert job_list([1, 2, 3], 3) == "jobs 1, 2 and 3"
    assert job_list([17], 2) == "jobs 17 and 1 unknown"
    assert job_list([], 2) == "2 jobs not in the job tables"


def test_a_slot_wait():
    w = Waiting(reason="slot", label="deliver_webhook customer=42", limit=2, holders=[17, 23], held=2, ahead=5)
    assert why(w) == "waiting for a slot of deliver_webhook customer=42: 2 of 2 held by jobs 17 and 23; 5 waiting ahead"
    w = Waiting(reason="slot", label="export", limit=3, holders=[], held=0, ahead=0)
    assert why(w) == ("waiting for a slot of export: 0 of 3 held (a wake-up or the re-drive starts one); "
                      "first in line")
    more = Waiting(reason="slot", label="x", limit=1, holders=[1], held=1, ahead=1000, ahead_more=True)
    assert why(more).endswith("1000+ waiting ahead")


def test_a_halted_group_and_a_lock():
    assert why(Waiting(reason="halted", label="export", ahead=2)) == (
        "waiting for a slot of export: the group is halted (limit 0; `limit` restores it); 2 waiting ahead")
    w = Waiting(reason="lock", label="report user=7", holders=[12], held=1, token=7, left_ms=41_000, ahead=2)
    assert why(w) == (
        "waiting for the execution lock of report user=7: held by job 12 (token 7, 41 s left); 2 waiting ahead")
    free = Waiting(reason="lock", label="report user=7", left_ms=0)
    assert "free now" in why(free)


def test_due_queued_and_pending():
    now = datetime(2026, 11, 24, 21, 7, 12)
    assert why(Waiting(reason="due", due_in_ms=180_000)) == "due in 3 m"
    assert why(Waiting(reason="retrying", due_in_ms=2_000)) == "failed, retrying: next attempt due in 2 s"
    assert why(Waiting(reason="queued", since=now - timedelta(minutes=4)), now) == (
        "queued since 2026-11-24 21:03:12 UTC (4 m)")
    assert why(Waiting(reason="pending", since=now), now).startswith("pending since 2026-11-24 21:07:12 UTC (0 ms)")
    assert why(None) == ""
    assert why(Waiting(reason="due", due_in_ms=1_000, note="Redis did not answer")) == (
        "due in 1 s (Redis did not answer)")
    assert why(Waiting(reason="slot", label="export", note="not all known: Redis down")) == (
        "waiting for a slot of export (not all known: Redis down)")


def test_more_held_than_the_limit_is_explained():
    from dramatiq_unique.ops.words import holding, over_limit

    assert over_limit(2, 2) == "" and over_limit(3, None) == ""
    assert over_limit(3, 1) == "3 held, limit lowered to 1 while they ran"
    assert over_limit(2, 0) == "2 held, halted while they ran"
    w = Waiting(reason="slot", label="sync", limit=1, holders=[4, 5, 6], held=3, ahead=0)
    assert why(w) == ("waiting for a slot of sync: 3 of 1 held by jobs 4, 5 and 6 (limit lowered to 1 while they "
                      "ran); first in line")
    assert holding("sync", 3, 1, [4, 5, 6]) == (
        "holds a slot of sync: 3 held (jobs 4, 5 and 6), limit lowered to 1 while they ran")
    assert holding("sync k=1", 1, 2, [4]) == "holds a slot of sync k=1: 1 of 2 held (job 4)"
    assert holding("sync", 1, None, [4]) == "holds a slot of sync: 1 held, no limit (job 4)"


def test_a_woken_job_that_waits_in_the_broker_holds_its_slot():
    now = datetime(2026, 11, 24, 21, 7, 12)
    w = Waiting(reason="woken", label="sync customer=42", since=now - timedelta(seconds=41))
    assert why(w, now) == ("woken with a slot of sync customer=42, which it holds: queued since "
                           "2026-11-24 21:06:31 UTC (41 s) for a worker thread to start it")


def test_an_overdue_retry_says_by_how_much_not_due_in_0_ms():
    assert why(Waiting(reason="retrying", due_in_ms=-180_000)) == "failed, retrying: next attempt overdue by 3 m"
    assert why(Waiting(reason="retrying", due_in_ms=0)) == "failed, retrying: next attempt overdue by 0 ms"
    assert why(Waiting(reason="retrying", due_in_ms=1)) == "failed, retrying: next attempt due in 1 ms"


def deliver(customer, payload="", region="eu"):
    pass


def config(**options) -> ActorConfig:
    return ActorConfig("deliver", deliver, options, JobModel, ())


def row(*args, options=None, unique_key=None, **kwargs):
    return SimpleNamespace(args=list(args), kwargs=kwargs, options=options or {}, unique_key=unique_key)


def test_parameter_names_are_bound_as_the_send_binds_them():
    c = config(concurrency_key=["customer"])
    assert words.render(c, "concurrency_key", row(42, "p")) == "customer=42"
    assert words.render(c, "concurrency_key", row(customer="acme")) == "customer=acme"
    both = config(unique_args=["customer", "region"])
    assert words.row_key(both, row(42, region="us", unique_key="deliver:ab")) == "customer=42 region=us"
    assert words.render(config(unique_args=True), "unique_args", row(1)) == "customer=1 payload= region=eu"


def test_no_words_without_the_actor_or_with_arguments_that_no_longer_bind():
    assert words.render(None, "unique_args", row(1), "deliver:0ef2770d1a2b3c4d") == "#0ef2770d1a2b"
    c = config(unique_args=["customer"])
    assert words.render(c, "unique_args", row(1, 2, 3, 4, 5), "deliver:0ef2770d1a2b3c") == "#0ef2770d1a2b"
    assert words.row_key(config(), row(1)) == ""


def test_a_key_callable_is_shown_by_its_result_unless_it_fails_or_is_slow():
    assert words.render(config(unique_args=lambda customer, **_: f"c{customer}"), "unique_args", row(7)) == "c7"
    assert words.render(config(unique_args=lambda *a: 1 / 0), "unique_args", row(7), "deliver:ffee") == "#ffee"

    def slow(*args, **kwargs):
        time.sleep(words.SLOW_CALLABLE_MS / 1000 * 2)
        return "slow"

    c = config(unique_args=slow)
    assert words.render(c, "unique_args", row(1), "deliver:aa") == "slow"  # then never called again
    assert words.render(c, "unique_args", row(1), "deliver:aa") == "#aa"


def test_long_values_are_cut():
    text = words.render(config(concurrency_key=["customer"]), "concurrency_key", row("x" * 500))
    assert len(text) == len("customer=") + words.MAX_VALUE and text.endswith("…")
