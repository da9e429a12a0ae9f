"""The event-log judge itself (tests/faults/events.py): it finds what it is meant to find.

Synthetic logs, no servers: a judge that passed everything would make the fault suite vacuous.
"""

from __future__ import annotations

import pytest

from tests.faults import events as ev

pytestmark = pytest.mark.slow  # part of the fault suite, though it takes milliseconds


def log(*lines: str) -> ev.Log:
    """``"start A k 1"`` (job, key, pid), ``"beat A"``, ``"end A 2"``, ``"done A"``, ``"kill 1"``, ``"fault"``..."""
    events = []
    pids: dict[str, int] = {}
    for seq, line in enumerate(lines, 1):
        word, *rest = line.split()
        e = {"seq": seq, "event": word, "t": float(seq), "tid": 1}
        if word == "start":
            job, key, pid = rest
            pids[job] = int(pid)
            e.update(job=job, key=key, pid=int(pid), kind="while", token=seq, attempt=1)
        elif word in ("beat", "lost", "end", "done"):
            job, *pid = rest  # the pid of the job's last start, unless given
            e.update(job=job, pid=int(pid[0]) if pid else pids[job], error=None)
        elif word in ("kill", "stop", "cont"):
            e["pid"] = int(rest[0])
        events.append(e)
    return ev.parse(events)


def test_two_runs_of_a_key_at_once_are_found():
    with pytest.raises(AssertionError, match="2 holders"):
        ev.check_holders(log("start A k 1", "start B k 2", "end A", "done A", "end B", "done B"), {"while": 1})
    ev.check_holders(log("start A k 1", "end A", "start B k 2", "done A", "end B", "done B"), {"while": 1})


def test_a_killed_run_holds_until_the_kill_and_a_fenced_one_until_its_last_beat():
    ev.check_holders(log("start A k 1", "beat A", "kill 1", "start B k 2", "end B", "done B"), {"while": 1})
    with pytest.raises(AssertionError, match="2 holders"):
        ev.check_holders(log("start A k 1", "start B k 2", "kill 1", "end B", "done B"), {"while": 1})
    frozen = ("start A k 1", "beat A", "stop 1", "start B k 2", "end B", "done B", "cont 1")
    ev.check_holders(log(*frozen, "lost A", "done A"), {"while": 1})
    with pytest.raises(AssertionError, match="2 holders"):  # resumed, it went on under the lock
        ev.check_holders(log(*frozen, "beat A", "end A", "done A"), {"while": 1})


def test_a_job_beside_itself_is_found_whatever_its_key():
    with pytest.raises(AssertionError, match="beside itself"):
        ev.check_holders(log("start A k 1", "start A j 2", "end A 1", "done A 1", "end A 2", "done A 2"), {})


def test_reruns_must_be_explained_by_cut_runs():
    ok = log("start A k 1", "kill 1", "start A k 2", "end A", "done A")
    figures = ev.check_reruns(ok, {"A"})
    assert (figures.jobs, figures.reruns, figures.cut) == (1, 1, 1)
    with pytest.raises(AssertionError, match="no fault explains"):
        ev.check_reruns(log("start A k 1", "start A k 2", "end A", "done A"), {"A"})
    with pytest.raises(AssertionError, match="runs beyond one per job"):
        ev.check_reruns(log("start A k 1", "end A", "done A", "start A k 2", "end A", "done A"), {"A"})
    with pytest.raises(AssertionError, match="never ran"):
        ev.check_reruns(log("start A k 1", "end A", "done A"), {"A", "B"})
    # A global fault's window exposes the runs in progress during it.
    ev.check_reruns(log("fault", "start A k 1", "back", "start A k 2", "end A", "done A"), {"A"})


def test_a_run_after_success_is_found():
    with pytest.raises(AssertionError, match="ran again after it succeeded"):
        ev.check_no_run_after_success(log("start A k 1", "end A", "done A", "start A k 2", "end A", "done A"))
