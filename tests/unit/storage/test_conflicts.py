"""The choice of a unique send's INSERT (dramatiq_unique.storage.conflicts): no service needed."""

from __future__ import annotations

import pytest

from dramatiq_unique.storage import conflicts


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    monkeypatch.setattr(conflicts, "_share", {})


def test_an_actor_starts_with_the_plain_insert():
    assert not conflicts.expect_holder("report")


def test_four_clashes_in_a_row_switch_it_and_new_keys_switch_it_back():
    for _ in range(3):
        conflicts.record("report", held=True)
    assert not conflicts.expect_holder("report")
    conflicts.record("report", held=True)
    assert conflicts.expect_holder("report")
    news = 0
    while conflicts.expect_holder("report"):
        conflicts.record("report", held=False)
        news += 1
    assert 2 <= news <= 10


def test_actors_are_apart():
    for _ in range(10):
        conflicts.record("report", held=True)
    assert conflicts.expect_holder("report") and not conflicts.expect_holder("invoice")


def test_a_steady_share_below_the_threshold_keeps_the_plain_insert():
    for n in range(400):  # one send in ten refused: below the break-even
        conflicts.record("report", held=n % 10 == 0)
    assert not conflicts.expect_holder("report")
