"""The places on deck (dramatiq_unique.parking.lot): the deck's bookkeeping, no services."""

from __future__ import annotations

import threading
import time
from datetime import datetime, timedelta

import pytest

from dramatiq_unique import JobModel
from dramatiq_unique.parking import lot as places_module
from dramatiq_unique.parking.groups import GroupInfo
from dramatiq_unique.parking.lot import DEPTH, Places, place_of

T0 = datetime(2026, 1, 1)
INFO = GroupInfo(JobModel, "created_at", 5_000)


def row(n: int, **options) -> JobModel:
    return JobModel(id=n, message_id=f"m-{n}", created_at=T0 + timedelta(seconds=n), options=options)


def on_deck(places: Places, group: str, *rows: JobModel) -> list:
    """Book and settle one reservation per row, as the deck's fill does; the rows sent back."""
    back = []
    for r in rows:
        assert places.book(group, with_holder=False)
        back += places.settle(group, INFO, [r], time.monotonic(), booked=1)[0]
    return back


def test_no_more_places_are_booked_than_the_deck_holds():
    places = Places()
    assert all(places.book("g", with_holder=False) for _ in range(DEPTH))
    assert not places.book("g", with_holder=False), "places under way count before their rows are on deck"
    assert places.book("other", with_holder=False), "per group"


def test_a_job_parking_books_a_place_only_while_a_holder_runs_here():
    places = Places()
    assert not places.book("g", with_holder=True)
    places.holding("g", 1)
    assert places.book("g", with_holder=True)
    places.holding("g", -1)
    assert not places.book("g", with_holder=True)


def test_rows_on_deck_keep_the_queue_order_and_a_late_earlier_job_takes_the_last_place():
    places = Places()
    assert on_deck(places, "g", row(3), row(1)) == []
    assert places.busy("g")
    early = row(0)
    assert not places.book("g", with_holder=False, late=place_of("created_at", row(5).created_at, None, 5))
    assert places.book("g", with_holder=False, late=place_of("created_at", early.created_at, None, 0))
    back, raced = places.settle("g", INFO, [early], time.monotonic(), booked=1)
    assert [r.id for r in back] == [3] and not raced, "the last on deck goes back to the queue"
    first = places.take_first("g")
    assert first is not None and first[0].row.id == 0 and first[1] == 1, "one place left, booked for the refill"


def test_a_reservation_that_raced_a_holder_letting_its_slot_go_goes_back():
    places = Places()
    began = time.monotonic()
    assert places.book("g", with_holder=False)
    assert places.released("g") is False, "nothing on deck yet"
    back, raced = places.settle("g", INFO, [row(1)], began, booked=1)
    assert raced and [r.id for r in back] == [1] and not places.busy("g")


def test_a_message_with_unique_options_of_its_own_does_not_stay_on_deck():
    assert [r.id for r in on_deck(Places(), "g", row(1, unique_ttl=10))] == [1]


def test_rows_kept_too_long_are_taken_off(monkeypatch):
    places = Places()
    on_deck(places, "g", row(1))
    assert places.stale() == []
    monkeypatch.setattr(places_module, "MAX_WAIT_MS", 0)
    assert [(g, d.row.id) for g, d in places.stale()] == [("g", 1)]
    assert not places.busy("g") and places.take_first("g") is None


@pytest.mark.parametrize("order_by, expected", [("created_at", T0), ("process_after", T0 + timedelta(hours=1))])
def test_a_place_follows_the_group_order(order_by, expected):
    assert place_of(order_by, T0, T0 + timedelta(hours=1), 7) == (expected, 7)
    assert place_of(order_by, T0, None, 7) == (T0, 7)


def test_a_holder_waits_for_a_reservation_under_way_before_it_looks_at_the_deck():
    """A claim beside a reservation under way would skip the row it locks: the holder waits for it."""
    places = Places()
    assert places.book("g", with_holder=False)
    settle = threading.Timer(0.05, lambda: places.settle("g", INFO, [row(2)], time.monotonic(), booked=1))
    settle.start()
    first = places.take_first("g", wait_ms=5_000)
    settle.join()
    assert first is not None and first[0].row.id == 2


def test_a_holder_waits_for_a_reservation_under_way_no_longer_than_its_bound():
    places = Places()
    assert places.book("g", with_holder=False)
    began = time.monotonic()
    assert places.take_first("g", wait_ms=30) is None
    assert time.monotonic() - began < 1
    assert places.take_first("g") is None, "no wait by default"
