"""``last_error`` keeps the real cause, and a job that finished is never reported lost.

The case behind both: a ``while_executing`` job runs past its lock's lease, so the
next job of its key is woken, takes the lock and draws the key's next fencing token,
which takes the first job's row off its attempt.  That attempt then ends, with
``LockLost`` or a result: nobody else will ever write its row, so its own outcome is
recorded, and the re-drive has nothing to call lost or dead-lettered.  (A job refused
because Redis was down is in test_refused_jobs.py: its ``last_error`` starts with
``RedisUnavailable``.)  Real Redis broker, SQLite and PostgreSQL.
"""

from __future__ import annotations

import threading

import dramatiq

from dramatiq_unique import LockLost, heartbeat
from tests.durable import passes, running_worker, total
from tests.helpers import job_of, wait_until


def overtaken(broker, ending: str):
    """Job 1 runs past its lease until job 2 of its key took the lock and ran; job 1 then
    ends as ``ending`` says.  Returns both messages and what ran."""
    second_ran = threading.Event()
    ran = []

    @dramatiq.actor(unique_args=["key"], unique_lock="while_executing", unique_ttl=300, max_retries=0)
    def work(key, n):
        ran.append(n)
        if n == 2:
            second_ran.set()
            return n
        assert second_ran.wait(15)
        if ending == "heartbeat":
            heartbeat()  # raises LockLost: the lock is job 2's now
        return n

    with running_worker(broker, threads=2):
        first = work.send("k", 1)
        wait_until(lambda: ran == [1], timeout=10)
        second = work.send("k", 2)
        wait_until(lambda: job_of(first).status not in ("queued", "running"), timeout=20,
                   what="the first job's outcome is recorded")
        wait_until(lambda: job_of(second).status == "succeeded", timeout=10)
    return first, second, ran


def test_a_lock_lost_job_without_retries_reads_lock_lost(fast, broker):
    first, second, ran = overtaken(broker, "heartbeat")
    job = job_of(first)
    assert job.status == "failed" and job.last_error.startswith("LockLost: "), job.last_error
    assert "execution lock" in job.last_error.splitlines()[0]
    counts = passes(2)
    assert total(counts, "failed") == total(counts, "lost") == 0
    assert job_of(first).last_error == job.last_error
    assert ran == [1, 2]


def test_a_job_that_finished_after_its_lease_ran_out_is_not_lost(fast, broker):
    first, second, ran = overtaken(broker, "return")
    job = job_of(first)
    assert job.status == "succeeded" and job.result == 1 and job.finished_at
    assert "lost" not in (job.last_error or "")
    counts = passes(2)
    assert total(counts, "lost") == total(counts, "redriven") == total(counts, "failed") == 0
    assert job_of(first).status == "succeeded" and ran == [1, 2]
    assert LockLost.__name__ in job.last_error  # the note says why another job of its key ran beside it
