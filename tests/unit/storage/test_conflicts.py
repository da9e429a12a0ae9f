"""The choice of a unique send's INSERT (dramatiq_unique.storage.jobs): no service needed."""

from __future__ import annotations

import pytest

from dramatiq_unique.storage import jobs


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    monkeypatch.setattr(jobs, "_share", {})


def test_an_actor_starts_with_the_plain_insert():
    assert not jobs.expect_holder("report")


def test_four_clashes_in_a_row_switch_it_and_new_keys_switch_it_back():
    for _ in range(3):
        jobs.record_clash("report", held=True)
    assert not jobs.expect_holder("report")
    jobs.record_clash("report", held=True)
    assert jobs.expect_holder("report")
    news = 0
    while jobs.expect_holder("report"):
        jobs.record_clash("report", held=False)
        news += 1
    assert 2 <= news <= 10


def test_actors_are_apart():
    for _ in range(10):
        jobs.record_clash("report", held=True)
    assert jobs.expect_holder("report") and not jobs.expect_holder("invoice")


def test_a_steady_share_below_the_threshold_keeps_the_plain_insert():
    for n in range(400):  # one send in ten refused: below the break-even
        jobs.record_clash("report", held=n % 10 == 0)
    assert not jobs.expect_holder("report")
