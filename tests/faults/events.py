"""Judging the fault suite's event log (written by tests/fault_app.py and the tests themselves).

A *run* is one execution of an actor body: its ``start``, ``beat``/``lost``/``end`` events and
the ``done`` after the suite's middlewares, all from one worker thread.  The order of events is
the Redis-side sequence, never a clock.

- A run **holds** its key (lock or slot) from its ``start`` to its last ``start``/``beat``/``end``
  event: every one of those was written while the lock or slot was held (``beat`` right after a
  ``heartbeat()`` that held).  A run whose process was SIGKILLed before its ``end`` holds until the
  ``kill`` event.  A frozen (SIGSTOPped) run that was fenced holds until its last beat before the
  stop, so the newer attempt started after it does not count as beside it; if it wrote a ``beat``
  or ``end`` after it resumed, that event stretches its hold over the newer attempt and the
  overlap is found.
- A run is **cut** if a fault could have ended it before its outcome was recorded: its process was
  killed or stopped while it was open (no ``done`` yet), or it was open at some point of a global
  fault's window (from a ``fault`` event, the database or the broker's Redis going down, to the
  next ``back`` event).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Iterable, Optional


@dataclass
class Run:
    pid: int
    tid: int
    job: str
    kind: str
    key: str
    token: int
    attempt: int
    start: int
    t_start: float
    beats: list[int] = field(default_factory=list)
    end: Optional[int] = None
    lost: Optional[int] = None
    done: Optional[int] = None
    t_done: Optional[float] = None
    done_error: Optional[str] = None
    killed: Optional[int] = None  # seq of the kill of its process while it was open
    stopped: Optional[int] = None  # seq of a stop of its process while it was open
    faulted: Optional[int] = None  # seq of a global fault while it was open

    @property
    def hold_end(self) -> int:
        own = max([self.start, *self.beats, *([self.end] if self.end is not None else [])])
        if self.killed is not None and self.end is None:
            return max(own, self.killed)
        return own

    @property
    def cut(self) -> bool:
        return self.killed is not None or self.stopped is not None or self.faulted is not None

    def __str__(self) -> str:
        return (f"run(job={self.job[:8]} key={self.key} pid={self.pid} token={self.token} attempt={self.attempt} "
                f"start={self.start} beats={self.beats[-1:] or '-'} end={self.end} lost={self.lost} "
                f"done={self.done}/{self.done_error} killed={self.killed} stopped={self.stopped} "
                f"faulted={self.faulted})")


@dataclass
class Log:
    events: list[dict]
    runs: list[Run]
    faults: list[dict]  # kill, stop, cont, fault, back events, in order

    def of_job(self, job: str) -> list[Run]:
        return [r for r in self.runs if r.job == job]

    def seq_time(self, seq: int) -> float:
        return next(e["t"] for e in self.events if e["seq"] == seq)


def parse(events: Iterable[dict]) -> Log:
    events = sorted(events, key=lambda e: e["seq"])
    runs: list[Run] = []
    open_runs: dict[tuple, Run] = {}  # (pid, tid, job) -> run without its done yet
    faults = []
    window = False  # between a fault and its back: every run that starts is exposed to it
    for e in events:
        kind = e["event"]
        if kind == "start":
            key = (e["pid"], e["tid"], e["job"])
            run = Run(pid=e["pid"], tid=e["tid"], job=e["job"], kind=e["kind"], key=e["key"], token=e["token"],
                      attempt=e["attempt"], start=e["seq"], t_start=e["t"])
            assert key not in open_runs, f"a thread started a job it was running: {e} beside {open_runs[key]}"
            if window:
                run.faulted = e["seq"]
            open_runs[key] = run
            runs.append(run)
        elif kind in ("beat", "lost", "end"):
            run = open_runs[(e["pid"], e["tid"], e["job"])]
            if kind == "beat":
                run.beats.append(e["seq"])
            else:
                setattr(run, kind, e["seq"])
        elif kind == "done":
            run = open_runs.pop((e["pid"], e["tid"], e["job"]), None)
            if run is not None:  # a done without a start: a message that was skipped or parked
                run.done, run.t_done, run.done_error = e["seq"], e["t"], e["error"]
        elif kind in ("kill", "stop"):
            faults.append(e)
            for k in [k for k in open_runs if k[0] == e["pid"]]:
                run = open_runs[k]
                if kind == "kill":
                    run.killed = e["seq"]
                    del open_runs[k]  # a killed process writes nothing more
                elif run.stopped is None:
                    run.stopped = e["seq"]
        elif kind == "fault":
            faults.append(e)
            window = True
            for run in open_runs.values():
                if run.faulted is None:
                    run.faulted = e["seq"]
        else:
            faults.append(e)
            if kind == "back":
                window = False
    return Log(events, runs, faults)


def max_holders(runs: Iterable[Run], by: str = "key") -> dict[str, tuple[int, list[Run]]]:
    """Per key (or job): the most runs holding it at one point of the order, and those runs."""
    groups: dict[str, list[Run]] = defaultdict(list)
    for run in runs:
        groups[getattr(run, by)].append(run)
    out = {}
    for name, group in groups.items():
        points = sorted([(r.start, 0, r) for r in group] + [(r.hold_end, 1, r) for r in group],
                        key=lambda p: (p[0], p[1]))
        holding: list[Run] = []
        worst: list[Run] = []
        for _, is_end, run in points:
            if is_end:
                holding.remove(run)
            else:
                holding.append(run)
                if len(holding) > len(worst):
                    worst = list(holding)
        out[name] = (len(worst), worst)
    return out


def check_holders(log: Log, allowed: dict[str, int]) -> None:
    """(b): no key held by more runs than its actor allows, and no job running beside itself."""
    problems = []
    for kind, limit in allowed.items():
        runs = [r for r in log.runs if r.kind == kind]
        for key, (n, worst) in max_holders(runs).items():
            if n > limit:
                problems.append(f"{kind} key {key}: {n} holders at once (allowed {limit}):\n    "
                                + "\n    ".join(map(str, worst)))
    for job, (n, worst) in max_holders(log.runs, by="job").items():
        if n > 1:
            problems.append(f"job {job} ran beside itself:\n    " + "\n    ".join(map(str, worst)))
    assert not problems, "\n".join(problems)


@dataclass
class Figures:
    jobs: int
    runs: int
    reruns: int
    cut: int
    unfinished: int

    def line(self, scenario: str, faults: int, recover_s: float, **extra) -> str:
        more = "".join(f" {k}={v}" for k, v in extra.items())
        return (f"FAULT {scenario} jobs={self.jobs} kills={faults} reruns={self.reruns} cut={self.cut} "
                f"recover_s={recover_s:.1f}{more}")


def check_reruns(log: Log, jobs: Iterable[str]) -> Figures:
    """(c): every run without its ``done`` was cut by a fault, and the runs beyond one per job are
    no more than the runs the faults cut.  Also: every job ran to its ``end`` and ``done``."""
    jobs = set(jobs)
    started = {r.job for r in log.runs}
    assert started <= jobs, f"runs of jobs that were never sent: {sorted(started - jobs)[:5]}"
    assert jobs <= started, f"jobs that never ran: {sorted(jobs - started)[:5]}"
    vanished = [r for r in log.runs if r.done is None and not r.cut]
    assert not vanished, "runs that never finished, and no fault explains it:\n" + "\n".join(map(str, vanished))
    cut = [r for r in log.runs if r.cut]
    reruns = len(log.runs) - len(jobs)
    assert reruns <= len(cut), (
        f"{reruns} runs beyond one per job, but the faults cut only {len(cut)} runs:\n"
        + "\n".join(str(r) for job in jobs if len(log.of_job(job)) > 1 for r in log.of_job(job))
    )
    unfinished = [r for r in log.runs if r.done is None]
    return Figures(jobs=len(jobs), runs=len(log.runs), reruns=reruns, cut=len(cut), unfinished=len(unfinished))


def check_no_run_after_success(log: Log) -> None:
    """A job whose run ended and was recorded (``end`` then ``done`` without error) never starts again,
    unless that run was cut by a fault (its outcome may not have been written)."""
    problems = []
    for run in log.runs:
        if run.end is None or run.done is None or run.done_error is not None or run.lost is not None or run.cut:
            continue
        later = [r for r in log.of_job(run.job) if r.start > run.done]
        if later:
            problems.append(f"job {run.job} ran again after it succeeded:\n    {run}\n    "
                            + "\n    ".join(map(str, later)))
    assert not problems, "\n".join(problems)
