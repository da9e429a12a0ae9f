"""The recent-keys memory of dramatiq_unique.unique.recent (no services)."""

from __future__ import annotations

import threading

from dramatiq_unique.unique.recent import _Recent


def test_a_key_counts_as_sent_from_its_first_look_on():
    recent = _Recent(3)
    assert recent.seen("a") is False
    assert recent.seen("a") is True


def test_the_oldest_key_is_forgotten_when_the_memory_is_full():
    recent = _Recent(3)
    for key in "abc":
        recent.seen(key)
    assert recent.seen("d") is False  # "a" makes room
    assert list(recent.keys) == ["b", "c", "d"]
    assert recent.seen("a") is False


def test_threads_looking_at_once_keep_the_memory_bounded():
    recent = _Recent(50)
    barrier = threading.Barrier(8)

    def look(n: int) -> None:
        barrier.wait(10)
        for i in range(2000):
            recent.seen(f"{n}:{i}")

    threads = [threading.Thread(target=look, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(recent.keys) <= 50 + 8  # each thread may add one while another evicts
