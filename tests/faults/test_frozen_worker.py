"""A worker SIGSTOPped past its lease, then resumed: it is fenced.

Two `dramatiq` worker groups (one process, two threads each) run long jobs (2 s, a heartbeat every
250 ms, a 1.5 s lease) of four keys, two jobs per key.  The test freezes a worker process in the
middle of a run; its lease runs out, the other worker takes the key (the waiting job of the key,
woken by its watchdog) and then the frozen job itself (its message handed back by the re-drive
once the frozen worker missed its broker heartbeats), and succeeds.  Then the test resumes the
frozen process.

Asserted: in the resumed run, ``heartbeat()`` raises ``LockLost`` and nothing more is done under
the lock; the row keeps the newer attempt's outcome and fencing token (the zombie's return value,
after it swallowed LockLost, is never recorded); the job does not run again after the newer
attempt succeeded; and the checks of every scenario (every job succeeded, no key with two holders,
no more reruns than the stop cut).
"""

from __future__ import annotations

import contextlib
import time

import pytest

import dramatiq_unique
from tests import fault_app
from tests.durable import RedisServer
from tests.faults import events as ev
from tests.faults.harness import fault_env, finish, open_runs_by_pid, prefix, report, start_rig, wait_for
from tests.faults.harness import rows as rows_of

pytestmark = pytest.mark.slow

TTL = 1_500
RUN_MS, BEAT_MS = 2_000, 250
KEYS, PER_KEY = 4, 2


@pytest.mark.parametrize("attr,kind", [("while_executing", "while"), ("unique", "unique")])
def test_a_worker_frozen_past_its_lease_is_fenced(attr, kind, tmp_path):
    with contextlib.ExitStack() as cleanup:
        server = RedisServer().start()
        cleanup.callback(server.stop)
        env = fault_env(broker_url=server.url, database_url=f"sqlite:///{tmp_path / 'jobs.db'}",
                        key_prefix=prefix(), ttl=TTL)
        app, fleet, redriver = start_rig(cleanup, env, tmp_path, threads=2)
        actor = getattr(app, attr)

        for n in range(PER_KEY):
            for k in range(KEYS):
                actor.send(f"k{k}", n, run_ms=RUN_MS, beat_ms=BEAT_MS)
        # until_and_while_executing takes one waiting job per key: the second send of a key is a
        # duplicate of the first unless that one started already.
        jobs = len(rows_of(app))

        def frozen_candidate():
            # A run well inside its work: at least one beat, and several left to try after the resume.
            for pid, runs in open_runs_by_pid(app.log, fleet.pids(), kind).items():
                if any(1 <= len(r.beats) <= RUN_MS // BEAT_MS - 4 for r in runs):
                    return pid
            return None

        pid = wait_for(frozen_candidate, timeout=30, what="a worker in the middle of a job")
        stop = fleet.stop(pid)
        assert stop is not None, "the worker exited before it was stopped"
        frozen = [r for r in ev.parse(app.log.read()).runs if r.pid == pid and r.stopped is not None]
        assert frozen
        frozen_jobs = {r.job for r in frozen}

        def newer_attempts_succeeded():
            jobs = [dramatiq_unique.get_job(job) for job in frozen_jobs]
            return all(j is not None and str(j.status) == "succeeded" for j in jobs)

        wait_for(newer_attempts_succeeded, timeout=30, what="the frozen jobs to succeed in their newer attempts")
        resumed = fleet.cont(pid)

        def zombies_done():
            runs = [r for r in ev.parse(app.log.read()).runs if r.pid == pid and r.stopped is not None]
            return all(r.done is not None for r in runs)

        wait_for(zombies_done, timeout=20, what="the resumed runs to finish")
        rows, log = finish(app, fleet, tmp_path, timeout=30, linger=1.5, expected=jobs)

    zombies = [r for r in log.runs if r.stopped is not None]
    for zombie in zombies:
        assert zombie.lost is not None and zombie.lost > resumed, f"heartbeat() did not raise LockLost: {zombie}"
        assert all(b < stop for b in zombie.beats) and zombie.end is None, f"it worked on after the resume: {zombie}"
        row = next(r for r in rows if r.message_id == zombie.job)
        newer = [r for r in log.of_job(zombie.job) if r.start > zombie.start and r.end is not None and r.done]
        assert newer, f"no newer attempt of {zombie.job} ran to its end"
        last = newer[-1]
        assert row.result == [last.pid, last.token] and row.result != fault_app.ZOMBIE, row.result
        assert row.fencing_token == last.token > zombie.token
        assert not [r for r in log.of_job(zombie.job) if r.start > last.done], "it ran again after it succeeded"
    ev.check_holders(log, {kind: 1})
    figures = ev.check_reruns(log, {r.message_id for r in rows})
    ev.check_no_run_after_success(log)
    last_done = max(r.t_done for r in log.runs if r.t_done is not None)
    report(figures.line(f"sigstop-{attr}", 1, last_done - log.seq_time(stop), frozen_runs=len(zombies),
                        stopped_s=round(log.seq_time(resumed) - log.seq_time(stop), 1)))


#: Frozen for longer than the broker's heartbeat timeout, but shorter than the job's lease.
WITHIN_TTL, WITHIN_HEARTBEAT_TIMEOUT, WITHIN_STOP_S = 8_000, 2_000, 4.0


@pytest.mark.parametrize("attr,kind", [("tracked", "tracked"), ("slot", "slot")])
def test_a_worker_frozen_within_its_lease_keeps_its_jobs(attr, kind, tmp_path):
    """A worker frozen past the broker's heartbeat timeout but within its jobs' leases (a long GC
    pause, a stalled VM) is taken for dead by Dramatiq, which hands its messages to the other
    worker (maintenance on every broker command here, as in a busy cluster) while the frozen
    worker still holds its jobs.  That second delivery must not start a second attempt beside the
    live one (it waits or is dropped); resumed, the frozen runs go on (their heartbeats hold) and
    each job runs once."""
    with contextlib.ExitStack() as cleanup:
        server = RedisServer().start()
        cleanup.callback(server.stop)
        env = fault_env(broker_url=server.url, database_url=f"sqlite:///{tmp_path / 'jobs.db'}",
                        key_prefix=prefix(), ttl=WITHIN_TTL, limit=KEYS,
                        heartbeat_timeout=WITHIN_HEARTBEAT_TIMEOUT, maintenance_chance=1_000_000)
        app, fleet, redriver = start_rig(cleanup, env, tmp_path, threads=2)
        actor = getattr(app, attr)

        for n in range(PER_KEY):
            for k in range(KEYS):
                actor.send(f"k{k}", n, run_ms=RUN_MS + 1_000, beat_ms=BEAT_MS)
        jobs = len(rows_of(app))

        def frozen_candidate():
            for pid, runs in open_runs_by_pid(app.log, fleet.pids(), kind).items():
                if any(1 <= len(r.beats) <= 4 for r in runs):
                    return pid
            return None

        pid = wait_for(frozen_candidate, timeout=30, what="a worker in the middle of a job")
        stop = fleet.stop(pid)
        assert stop is not None, "the worker exited before it was stopped"
        time.sleep(WITHIN_STOP_S)
        resumed = fleet.cont(pid)
        rows, log = finish(app, fleet, tmp_path, timeout=40, linger=1.5, expected=jobs)

    frozen = [r for r in log.runs if r.stopped is not None]
    assert frozen
    problems = []
    for run in frozen:
        others = [r for r in log.of_job(run.job) if r is not run]
        if run.lost is not None or run.end is None or others:
            problems.append(f"frozen within its lease, job {run.job} did not keep its only attempt:\n    {run}\n    "
                            + "\n    ".join(map(str, others)))
        row = next(r for r in rows if r.message_id == run.job)
        if row.result != [run.pid, run.token]:
            problems.append(f"job {run.job}'s row has another outcome than its frozen (live) run's: {row.result}")
    assert not problems, "\n".join(problems)
    ev.check_holders(log, {"slot": KEYS} if kind == "slot" else {})
    figures = ev.check_reruns(log, {r.message_id for r in rows})
    ev.check_no_run_after_success(log)
    last_done = max(r.t_done for r in log.runs if r.t_done is not None)
    report(figures.line(f"sigstop-within-lease-{attr}", 1, last_done - log.seq_time(stop), frozen_runs=len(frozen),
                        stopped_s=round(log.seq_time(resumed) - log.seq_time(stop), 1)))
