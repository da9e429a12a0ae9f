"""The nemesis's checker itself (tests/faults/checker.py): it finds what it is meant to find.

Synthetic histories, no servers: a checker that passed everything would make the nemesis vacuous.
Times are seconds; the lease is 3 s.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from tests.faults import checker

pytestmark = pytest.mark.slow  # part of the fault suite, though it takes milliseconds

TTL = 3_000


class History:
    """Events of a synthetic history; jobs are sent and succeed unless told otherwise."""

    def __init__(self) -> None:
        self.events: list[dict] = []
        self.results: dict[str, Any] = {}

    def add(self, t: float, event: str, **fields: Any) -> "History":
        fields.setdefault("pid", 1)
        fields.setdefault("tid", 1)
        self.events.append({"e": event, "t": t, **fields})
        return self

    def send(self, job: str, t: float = 0.0) -> "History":
        self.add(t, "send", built=job, kind="while", pid=99)
        return self.add(t + 0.01, "sent", built=job, returned=job, pid=99)

    def run(self, job: str, start: float, *, key: str = "k", kind: str = "while", token: int = 1, pid: int = 1,
            beats: tuple = (), end: float | None = None, done: float | None = None, error: str | None = None,
            lost: float | None = None) -> "History":
        run = dict(job=job, kind=kind, key=key, token=token, attempt=token, pid=pid)
        self.add(start - 0.01, "deliver", job=job, pid=pid)
        self.add(start, "start", **run)
        for t0 in beats:
            self.add(t0 + 0.01, "beat", t0=t0, **run)
        if lost is not None:
            self.add(lost + 0.01, "lost", t0=lost, **run)
        if end is not None:
            self.add(end, "end", result=[pid, token], **run)
            self.results[job] = [pid, token]
        if done is not None:
            self.add(done, "done", job=job, pid=pid, error=error)
        return self

    def check(self, drop: tuple = (), **rows: Any) -> list[str]:
        sent = [e["built"] for e in self.events if e["e"] == "send" and e["built"] not in drop]
        table = [SimpleNamespace(message_id=job, actor_name="nem_while", result=self.results.get(job),
                                 status="succeeded" if job in self.results else "running", parked_on=None,
                                 lease_until=None, attempts=1, worker=None, last_error=None) for job in sent]
        for job, fields in rows.items():
            row = next(r for r in table if r.message_id == job)
            vars(row).update(fields)
        problems, _ = checker.check(self.events, table, ttl_ms=TTL)
        return problems


def one(problems: list[str], words: str) -> None:
    assert len(problems) == 1 and words in problems[0], problems


def test_a_clean_history_passes():
    h = History().send("A").send("B")
    h.run("A", 1.0, beats=(1.25, 1.5), end=1.6, done=1.7).run("B", 1.8, beats=(2.0,), end=2.1, done=2.2)
    assert h.check() == []


def test_a_key_taken_while_the_older_lease_is_live_is_found():
    h = History().send("A").send("B")
    h.run("A", 1.0, beats=(1.25,), end=3.0, done=3.1).run("B", 2.0, token=2, beats=(2.25,), end=2.5, done=2.6)
    one(h.check(), "overlap within a live lease")


def test_a_lease_that_ran_out_or_that_redis_lost_no_longer_counts():
    # A's lease (renewed at 1.25) ran out at 4.25: B started after it, and A's next heartbeat failed.
    h = History().send("A").send("B")
    h.run("A", 1.0, beats=(1.25,), lost=5.0, done=5.1, error="LockLost")
    h.run("B", 4.5, token=2, pid=2, beats=(4.75,), end=5.5, done=5.6)
    h.add(1.2, "stop", pid=1, tid=9).add(4.9, "cont", pid=1, tid=9)
    h.run("A", 6.0, token=3, end=6.2, done=6.3)  # its retry
    assert h.check() == []
    # The same with B starting at 2.0, allowed only because Redis lost its data at 1.5.
    h = History().send("A").send("B")
    h.run("A", 1.0, beats=(1.25,), lost=2.5, done=2.6, error="LockLost")
    h.run("B", 2.0, token=2, pid=2, beats=(2.25,), end=3.0, done=3.1)
    h.run("A", 6.0, token=3, end=6.2, done=6.3)
    assert "overlap within a live lease" in "".join(h.check())
    h.add(1.5, "fault", kind="redis-kill", id=1, phase="begin", tid=9).add(1.8, "fault", kind="redis-kill", id=1,
                                                                               phase="end", tid=9)
    assert h.check() == []


def test_an_older_run_that_goes_on_unfenced_is_found():
    h = History().send("A").send("B")
    h.run("A", 1.0, beats=(1.25, 6.0), end=6.1, done=6.2)  # frozen from 1.3 to 5.9, then its heartbeat held
    h.run("B", 4.5, token=2, beats=(4.75,), end=5.0, done=5.1)
    h.add(1.3, "stop", pid=1, tid=9).add(5.9, "cont", pid=1, tid=9)
    problems = h.check()
    assert any("unfenced" in p and "heartbeat begun at 6.00 held" in p for p in problems), problems


def test_reruns_must_be_explained():
    # A lost its lock with no fault (a lease cut short would also be an overlap if B had come sooner).
    h = History().send("A")
    h.run("A", 1.0, beats=(1.25,), lost=1.5, done=1.6, error="LockLost").run("A", 5.0, token=2, end=5.2, done=5.3)
    one(h.check(), "unexplained rerun")
    killed = History().send("A")
    killed.run("A", 1.0, beats=(1.25,)).add(1.4, "kill", pid=1, tid=9).run("A", 5.0, token=2, pid=2, end=5.2,
                                                                           done=5.3)
    assert killed.check() == []
    stalled = History().send("A")  # its heartbeats 2.5 s apart: the machine starved it
    stalled.run("A", 1.0, beats=(1.25,), lost=3.75, done=3.8, error="LockLost")
    stalled.run("A", 4.5, token=2, end=4.6, done=4.7)
    assert stalled.check() == []
    pg = History().send("A")  # its outcome could not be written while PostgreSQL was down
    pg.run("A", 1.0, end=1.2, done=1.3).run("A", 9.0, token=2, end=9.2, done=9.3)
    pg.add(1.1, "fault", kind="pg-restart", id=1, phase="begin", tid=9)
    pg.add(3.0, "fault", kind="pg-restart", id=1, phase="end", tid=9)
    assert pg.check() == []


def test_a_body_cut_by_its_time_limit_explains_its_rerun():
    h = History().send("A")
    h.run("A", 1.0, beats=(1.25,), done=2.1, error="TimeLimitExceeded").run("A", 5.0, token=2, end=5.2, done=5.3)
    one(h.check(), "unexplained rerun")
    h.add(2.0, "raised", job="A", kind="while", key="k", token=1, attempt=1, error="TimeLimitExceeded")
    assert h.check() == []
    paused = History().send("A")  # its outcome waited while PostgreSQL was paused
    paused.run("A", 1.0, end=1.2, done=4.0).run("A", 9.0, token=2, end=9.2, done=9.3)
    paused.add(1.1, "fault", kind="pg-pause", id=1, phase="begin", tid=9)
    paused.add(3.9, "fault", kind="pg-pause", id=1, phase="end", tid=9)
    assert paused.check() == []


def test_a_job_that_ran_again_after_its_success_was_recorded_is_found():
    """However well explained its rerun (here a pause of PostgreSQL), a job recorded ``succeeded`` never runs
    again: its row's history has no attempt after a success."""
    h = History().send("A")
    h.run("A", 1.0, end=1.2, done=4.0).run("A", 9.0, token=2, end=9.2, done=9.3)
    h.add(1.1, "fault", kind="pg-pause", id=1, phase="begin", tid=9)
    h.add(3.9, "fault", kind="pg-pause", id=1, phase="end", tid=9)
    assert h.check(A=dict(history=[{"status": "retrying"}, {"status": "succeeded"}])) == []
    one(h.check(A=dict(history='[{"status": "succeeded"}, {"status": "retrying"}, {"status": "succeeded"}]')),
        "ran after its success: job A")


def test_a_checkpoint_step_redone_is_found():
    h = History().send("A")
    h.run("A", 1.0, kind="steps")
    h.add(1.1, "step_run", job="A", step="a").add(1.3, "step_ok", job="A", step="a", t0=1.05, wrote=True)
    h.add(1.4, "kill", pid=1, tid=9)
    h.run("A", 3.0, kind="steps", token=2, pid=2, end=3.5, done=3.6)
    assert h.check() == []
    h.add(3.1, "step_run", job="A", step="a", pid=2)
    one(h.check(), "checkpoint step 'a' of job A redone")


def test_a_stuck_row_a_fenced_outcome_a_lost_send_and_a_hung_send_are_found():
    h = History().send("A")
    h.run("A", 1.0, end=1.2, done=1.3)
    one(h.check(A=dict(status="retrying", parked_on="lock:k")), "stuck: job A")
    h = History().send("A")
    h.run("A", 1.0, end=1.2, done=1.3).add(1.25, "stop", pid=1, tid=9).add(9.0, "cont", pid=1, tid=9)
    h.run("A", 5.0, token=2, pid=2, end=5.2, done=5.3)
    one(h.check(A=dict(result=[1, 1])), "a fenced outcome stood")
    lost = History().send("A").send("B")
    lost.run("A", 1.0, end=1.2, done=1.3)
    one(lost.check(drop=("B",)), "the send of B returned B, which has no row")
    hung = History().send("A")
    hung.events[-1]["t"] = 45.0
    hung.run("A", 50.0, end=50.2, done=50.3)
    one(hung.check(), "a send took")


def test_a_stalled_link_explains_its_workers_reruns_only():
    h = History().send("A")
    # A's renewal at 1.3 timed out on the stalled link (its lease ran out meanwhile).
    h.run("A", 1.0, beats=(1.25,), lost=1.3, done=1.4, error="LockLost").run("A", 5.0, token=2, pid=2, end=5.2,
                                                                              done=5.3)
    one(h.check(), "unexplained rerun")
    other = list(h.events)
    h.add(1.28, "fault", kind="pg-link-stall", id=1, phase="begin", target=1, tid=9)
    h.add(5.9, "fault", kind="pg-link-stall", id=1, phase="end", tid=9)
    assert h.check() == []
    h.events = other  # the same stall on another worker explains nothing here
    h.add(1.28, "fault", kind="pg-link-stall", id=1, phase="begin", target=2, tid=9)
    h.add(5.9, "fault", kind="pg-link-stall", id=1, phase="end", tid=9)
    one(h.check(), "unexplained rerun")


def test_a_run_that_began_after_a_newer_attempt_of_its_job_is_found():
    """A run under an older token that begins its body after a newer attempt's run began is found, however well
    explained (a stalled link: its start's reply came late); a process frozen between its delivery and its start
    may resume there, and only fencing stops it."""
    def history() -> History:
        h = History().send("A")
        h.run("A", 2.0, token=2, pid=2, end=2.2, done=2.3)
        h.run("A", 6.5, lost=6.6, done=6.7, error="LockLost")
        h.events = [e for e in h.events if not (e["e"] == "deliver" and e["pid"] == 1)]
        return h.add(0.95, "deliver", job="A", pid=1)  # its start was asked for at 1.0

    h = history()
    h.add(1.0, "fault", kind="pg-link-stall", id=1, phase="begin", target=1, tid=9)
    h.add(6.0, "fault", kind="pg-link-stall", id=1, phase="end", tid=9)
    one(h.check(), "started after a newer attempt: job A")
    frozen = history()
    frozen.add(1.0, "stop", pid=1, tid=9).add(6.0, "cont", pid=1, tid=9)
    assert frozen.check() == []


def test_a_worker_that_took_no_probe_job_is_found():
    h = History().send("A").send("P1").send("P2")
    h.run("A", 1.0, end=1.2, done=1.3)
    h.run("P1", 5.0, end=5.5, done=5.6).run("P2", 5.0, pid=2, end=5.5, done=5.6)
    h.add(4.9, "probe", pids=[1, 2], jobs=["P1", "P2"], pid=99)
    assert h.check() == []
    h.add(4.9, "probe", pids=[1, 2, 3], jobs=["P1", "P2"], pid=99)
    one(h.check(), "worker idle: process 3")
