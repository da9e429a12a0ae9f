"""The nemesis's checker: the history (tests/faults/history.py) and the job table, judged.

Verdicts, each a list of violations:

- **stuck or lost**: after the faults stopped and the recovery time, every job row succeeded; every send
  that returned resolves to a row; every row was sent by the run; a succeeded row's result is that of
  the run of its job that ended with the highest fencing token (a fenced run's outcome never stands).
- **overlap within a live lease**: a run holds its key for certain from the end of a ``heartbeat()``
  that renewed its Redis lease (an execution lock, a slot) until that lease would run out (the call's
  start plus the lease), unless it ended first or Redis lost its data meanwhile; a run that started
  holds it at its start.  At no point may more runs hold one key for certain than its actor allows.
- **overlap past an expired lease, unfenced**: once a newer run of the same job (or of the same key,
  for a key whose execution lock draws the tokens) started, the older run, if still going, is fenced:
  no ``heartbeat()`` of it begun after that start holds (for Redis leases) and no checkpoint it began
  writing after that start is recorded.
- **unexplained rerun**: every run of a job but its last was ended by a cause the history shows: a
  deliberate failure, a SIGKILL or a SIGSTOP of its process or a stall of its links to the servers
  while it ran, a Redis or PostgreSQL fault while it ran (or up to ``GRACE`` after: a dead connection
  is found at its next use), its body interrupted by its time limit, or a stall of its own (its
  heartbeats further apart than most of its lease: the machine starved it).
- **checkpoint step redone**: a step's side effect never runs in a run that started after another run
  recorded that step (the newer run read the job's checkpoints when it started).
- **ran after its success**: no attempt of a job follows one its row's history records ``succeeded``.
- **started after a newer attempt**: no run of a job begins its body after a run of the job under a
  newer fencing token began, unless its process was frozen (SIGSTOP) between its delivery and its
  start.  A newer token is drawn only once the older attempt's lease ran out, and an attempt does not
  begin past its lease, however late the replies to its start came (a stalled link); a frozen process
  may resume anywhere, and only the fencing of its writes stops it there.
- **send hung**: no send took longer than ``SEND_LIMIT``.
- **worker idle**: every worker process alive (and booted) at the probe (after the recovery, enough jobs to
  keep every worker busy a while) ran one of its jobs: a worker that took none lost its threads or its
  consumer.

Events are ordered by ``t`` (CLOCK_MONOTONIC, one clock for the machine).  A verdict compares two
events only to order them, or an event with a lease written by the suite; never by how close in
time they were.  The fault events (``kill``, ``stop``, ``cont``, ``fault`` begin and end, ``died``)
are the runner's; a ``fault`` with a ``target`` (a link stall) is of one worker process.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter, defaultdict
from typing import Any, Iterable, Optional

from tests.faults.nemesis_app import KINDS

#: Seconds after a Redis or PostgreSQL fault ended during which it still explains a failed run.
GRACE = 5.0
#: Seconds of the lease not relied upon: Redis expires keys by its own clock.
LEASE_MARGIN = 0.25
#: A run whose heartbeats were this share of its lease apart (or more) stalled by itself.
STALL_SHARE = 0.8
#: Seconds a send may take at most (guarantee 6: no call waits without bound).
SEND_LIMIT = 30.0
#: Global faults, by the name of their kind.
GLOBAL = ("redis-kill", "redis-pause", "pg-restart", "pg-pause")
#: Causes a rerun can have, in the order the figures name the first that applies.
CAUSES = ("retry", "kill", "died", "stop", "pg-link-stall", "redis-link-stall", *GLOBAL, "time-limit", "stall")


@dataclasses.dataclass
class Run:
    pid: int
    tid: int
    job: str
    kind: str
    key: str
    token: int
    attempt: int
    start: float
    deliver: Optional[float] = None
    beats: list[tuple[float, float]] = dataclasses.field(default_factory=list)
    lost: Optional[float] = None
    beat_error: Optional[float] = None
    steps_run: list[tuple[str, float]] = dataclasses.field(default_factory=list)
    steps_ok: list[tuple[str, float, float, bool]] = dataclasses.field(default_factory=list)
    fail: Optional[float] = None
    raised: Optional[float] = None
    #: What its body raised (the exception's class name).
    raised_error: Optional[str] = None
    end: Optional[float] = None
    result: Any = None
    done: Optional[float] = None
    error: Optional[str] = None

    @property
    def exited(self) -> float:
        """When its body returned or raised (never, for a run killed in it): from then on its lock
        or slot may be released."""
        times = [t for t in (self.end, self.raised, self.done) if t is not None]
        return min(times) if times else float("inf")

    @property
    def began(self) -> float:
        """When its delivery began (its start, if the history has no delivery)."""
        return self.deliver if self.deliver is not None else self.start

    @property
    def until(self) -> float:
        """When it stopped running, as far as the history tells (its done; still going: never)."""
        return self.done if self.done is not None else float("inf")

    def __str__(self) -> str:
        last = f"{self.beats[-1][0]:.2f}" if self.beats else "-"
        return (f"run(job={self.job[:8]} {self.kind}/{self.key} pid={self.pid} token={self.token} "
                f"attempt={self.attempt} start={self.start:.2f} beats={len(self.beats)} last_beat={last} "
                f"lost={_t(self.lost)} end={_t(self.end)} done={_t(self.done)}/{self.error})")


def _t(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.2f}"


@dataclasses.dataclass
class Fault:
    kind: str
    begin: float
    end: float
    target: Optional[int] = None  # the worker pid of a kill, a stop, a death, a link stall


@dataclasses.dataclass
class Parsed:
    runs: list[Run]
    faults: list[Fault]
    sends: list[dict]  # each: built, kind, returned (or None), error (or None), took
    healed: Optional[float]
    #: The probe after the recovery: the live worker processes and the probe's jobs.
    probe: Optional[dict] = None

    def of_job(self) -> dict[str, list[Run]]:
        out: dict[str, list[Run]] = defaultdict(list)
        for run in self.runs:
            out[run.job].append(run)
        for runs in out.values():
            runs.sort(key=lambda r: r.start)
        return out


def parse(events: Iterable[dict]) -> Parsed:
    runs: list[Run] = []
    open_runs: dict[tuple, Run] = {}
    delivered: dict[tuple, float] = {}
    faults: list[Fault] = []
    begun: dict[Any, dict] = {}
    stopped: dict[int, float] = {}
    sends: dict[str, dict] = {}
    healed, probe = None, None
    for e in sorted(events, key=lambda e: e["t"]):
        kind, t = e["e"], e["t"]
        at = (e.get("pid"), e.get("tid"), e.get("job"))
        if kind == "deliver":
            delivered[at] = t
        elif kind == "start":
            run = Run(pid=e["pid"], tid=e["tid"], job=e["job"], kind=e["kind"], key=e["key"], token=e["token"],
                      attempt=e["attempt"], start=t, deliver=delivered.pop(at, None))
            open_runs[at] = run
            runs.append(run)
        elif kind in ("done", "skip"):
            delivered.pop(at, None)
            run = open_runs.pop(at, None)
            if run is not None:
                run.done, run.error = t, e.get("error")
        elif at in open_runs:
            _attach(open_runs[at], kind, e)
        elif kind == "kill" or kind == "died":
            faults.append(Fault(kind, t, t, target=e["pid"]))
        elif kind == "stop":
            stopped[e["pid"]] = t
        elif kind == "cont":
            faults.append(Fault("stop", stopped.pop(e["pid"], t), t, target=e["pid"]))
        elif kind == "fault":
            if e["phase"] == "begin":
                begun[e["id"]] = e
            else:
                first = begun.pop(e["id"], e)
                faults.append(Fault(e["kind"], first["t"], t, target=first.get("target")))
        elif kind == "send":
            sends[e["built"]] = {"built": e["built"], "kind": e["kind"], "returned": None, "error": None, "t": t,
                                 "took": None}
        elif kind in ("sent", "refused"):
            send = sends[e["built"]]
            send["took"] = t - send["t"]
            send["returned" if kind == "sent" else "error"] = e.get("returned") or e.get("error")
        elif kind == "healed":
            healed = t
        elif kind == "probe":
            probe = e
    for pid, t in stopped.items():  # never resumed (killed while stopped): stopped until the end
        faults.append(Fault("stop", t, float("inf"), target=pid))
    for e in begun.values():
        faults.append(Fault(e["kind"], e["t"], float("inf"), target=e.get("target")))
    return Parsed(runs, faults, list(sends.values()), healed, probe)


def _attach(run: Run, kind: str, e: dict) -> None:
    t = e["t"]
    if kind == "beat":
        run.beats.append((e["t0"], t))
    elif kind == "lost":
        run.lost = e["t0"]
    elif kind == "beat_error":
        run.beat_error = e["t0"]
    elif kind == "step_run":
        run.steps_run.append((e["step"], t))
    elif kind == "step_ok":
        run.steps_ok.append((e["step"], e["t0"], t, bool(e["wrote"])))
    elif kind == "step_refused":
        run.lost = e["t0"] if run.lost is None else min(run.lost, e["t0"])
    elif kind == "fail":
        run.fail = t
    elif kind == "raised":
        run.raised, run.raised_error = t, e.get("error")
    elif kind == "end":
        run.end, run.result = t, e["result"]


# -- the verdicts ----------------------------------------------------------------------


def stuck_or_lost(parsed: Parsed, rows: list[Any]) -> list[str]:
    problems = []
    by_id = {row.message_id: row for row in rows}
    runs = parsed.of_job()
    for row in rows:
        if str(row.status) != "succeeded":
            problems.append(f"stuck: job {row.message_id} ({row.actor_name}) is {row.status}, parked on "
                            f"{row.parked_on}, lease {row.lease_until}, attempts {row.attempts}, worker {row.worker}: "
                            f"{(row.last_error or '').splitlines()[0][:160] if row.last_error else '-'}")
            continue
        ended = sorted((r for r in runs.get(row.message_id, []) if r.end is not None), key=lambda r: r.token)
        if not ended:
            problems.append(f"lost: job {row.message_id} succeeded, but no run of it ended")
        elif ended[-1].result != row.result:
            problems.append(f"a fenced outcome stood: job {row.message_id}'s result is {row.result}, not that of "
                            f"its run with the highest token, {ended[-1]}")
    built = {send["built"] for send in parsed.sends}
    for send in parsed.sends:
        if send["returned"] is not None and send["returned"] not in by_id:
            problems.append(f"lost: the send of {send['built']} returned {send['returned']}, which has no row")
    for row in rows:
        if row.message_id not in built:
            problems.append(f"a job nobody sent: {row.message_id} ({row.actor_name})")
    for job in runs:
        if job not in by_id:
            problems.append(f"a job ran that has no row: {job}")
    return problems


def _redis_losses(parsed: Parsed) -> list[float]:
    return sorted(f.begin for f in parsed.faults if f.kind == "redis-kill")


def _held(run: Run, ttl: float, losses: list[float]) -> list[tuple[float, float]]:
    """The spans in which ``run`` held its key for certain (see the module docstring)."""
    spans = []
    for t0, t1 in run.beats:
        until = min([t0 + ttl - LEASE_MARGIN, run.exited, *[loss for loss in losses if loss > t0]])
        if t1 <= until:
            spans.append((t1, until))
    return spans


def overlap_within_live_leases(parsed: Parsed, ttl_ms: float) -> list[str]:
    problems = []
    ttl = ttl_ms / 1000
    losses = _redis_losses(parsed)
    groups: dict[tuple, list[Run]] = defaultdict(list)
    for run in parsed.runs:
        if KINDS[run.kind].holders is not None and KINDS[run.kind].leased:
            groups[(run.kind, run.key)].append(run)
    for (kind, key), runs in groups.items():
        limit = KINDS[kind].holders
        assert limit is not None
        points = []
        for run in runs:
            for begin, end in _held(run, ttl, losses):
                points += [(begin, 0, id(run), run), (end, 1, id(run), run)]
        points.sort(key=lambda p: (p[0], p[1]))
        holding: Counter = Counter()
        reported = False
        for _, is_end, ident, _run in points:
            if is_end:
                holding[ident] -= 1
                if not holding[ident]:
                    del holding[ident]
                continue
            holding[ident] += 1
            if len(holding) > limit and not reported:
                reported = True
                who = [r for r in runs if id(r) in holding]
                problems.append(f"overlap within a live lease: {kind} key {key} held by {len(holding)} runs at once "
                                f"(allowed {limit}):\n    " + "\n    ".join(map(str, who)))
    return problems


def overlap_unfenced(parsed: Parsed) -> list[str]:
    problems = []
    groups: dict[tuple, list[Run]] = defaultdict(list)
    for run in parsed.runs:
        groups[("job", run.job)].append(run)
        if KINDS[run.kind].key_tokens:
            groups[("key", run.kind, run.key)].append(run)
    for runs in groups.values():
        # Tokens give the order of the attempts (a run frozen before it wrote its start has the older one).
        runs = sorted(runs, key=lambda r: (r.token, r.start))
        first: Optional[Run] = None  # of the runs with a higher token, the one that started first
        for old in reversed(runs):
            if first is not None and first.token > old.token and old.until > first.start:
                late = []
                # A heartbeat renews the row's lease too, fenced, when a tenth of it has passed since the last
                # write: a run that was not renewing long enough for a newer run of its job to start writes it.
                if KINDS[old.kind].leased or old.job == first.job:
                    late += [f"a heartbeat begun at {t0:.2f} held" for t0, _ in old.beats if t0 > first.start]
                late += [f"step {name!r} begun at {t0:.2f} was recorded"
                         for name, t0, _, wrote in old.steps_ok if wrote and t0 > first.start]
                if late:
                    problems.append(f"overlap past an expired lease, unfenced: after {first} started, {old} went on: "
                                    + "; ".join(late))
            if first is None or old.start < first.start:
                first = old
    return problems


def explain(run: Run, parsed: Parsed, ttl_ms: float) -> list[tuple[str, float]]:
    """The causes that could have ended ``run`` before its outcome stood, with when each ended."""
    causes = []
    if run.fail is not None:
        causes.append(("retry", run.fail))
    if run.raised is not None and run.raised_error == "TimeLimitExceeded":  # its body ran past its time limit
        causes.append(("time-limit", run.raised))
    for fault in parsed.faults:
        if fault.target is not None:
            if fault.target == run.pid and fault.end >= run.began and fault.begin <= run.until:
                causes.append((fault.kind, fault.end))
        elif fault.begin <= run.until and fault.end + GRACE >= run.began:
            causes.append((fault.kind, fault.end))
    marks = [run.began, run.start, *[t0 for t0, _ in run.beats]]
    marks += [t for t in (run.lost, run.beat_error, run.raised, run.end, run.done) if t is not None]
    marks.sort()
    if any(b - a >= STALL_SHARE * ttl_ms / 1000 for a, b in zip(marks, marks[1:], strict=False)):
        causes.append(("stall", marks[-1]))
    return causes


def reruns(parsed: Parsed, ttl_ms: float, figures: dict) -> list[str]:
    problems = []
    by_cause: Counter = Counter()
    recovery = 0.0
    for job, runs in parsed.of_job().items():
        last_done = max((r.until for r in runs if r.done is not None), default=None)
        runs = sorted(runs, key=lambda r: (r.token, r.start))  # the order of its attempts
        healed = None
        for run, after in zip(runs, runs[1:], strict=False):
            causes = explain(run, parsed, ttl_ms)
            if not causes:
                problems.append(f"unexplained rerun of job {job}: no fault ended\n    {run}\n  before\n    {after}")
                continue
            names = {name for name, _ in causes}
            by_cause[next(c for c in CAUSES if c in names)] += 1
            healed = max(end for name, end in causes if name != "retry") if names != {"retry"} else None
        # The job's recovery: from the end of the fault that cut its last cut run to its last run's end.
        if last_done is not None and healed is not None and healed != float("inf"):
            recovery = max(recovery, last_done - healed)
    figures["reruns"] = dict(sorted(by_cause.items()))
    figures["longest_recovery_s"] = round(recovery, 1)
    return problems


def steps_redone(parsed: Parsed) -> list[str]:
    problems = []
    for job, runs in parsed.of_job().items():
        written = [(name, t1, run) for run in runs for name, _, t1, wrote in run.steps_ok if wrote]
        for run in runs:
            for name, t in run.steps_run:
                before = [w for w in written if w[0] == name and w[2] is not run and w[1] < run.start]
                if before:
                    problems.append(f"checkpoint step {name!r} of job {job} redone at {t:.2f} in\n    {run}\n  "
                                    f"though recorded before it started by\n    {before[0][2]}")
    return problems


def ran_after_success(rows: list[Any]) -> list[str]:
    """No attempt of a job follows one its row recorded ``succeeded`` (its history, in the order written)."""
    problems = []
    for row in rows:
        history = getattr(row, "history", None)  # rows of a run recorded before the checker read it: none
        history = history if isinstance(history, list) else json.loads(history or "[]")
        statuses = [entry.get("status") for entry in history]
        if "succeeded" in statuses[:-1]:
            problems.append(f"ran after its success: job {row.message_id} ({row.actor_name}) has the attempts "
                            f"{statuses} in its history")
    return problems


def started_after_newer(parsed: Parsed) -> list[str]:
    problems = []
    for job, runs in parsed.of_job().items():
        for old in runs:
            newer = [r for r in runs if r.token > old.token and r.start < old.start]
            frozen = any(f.kind == "stop" and f.target == old.pid and f.end >= old.began and f.begin <= old.start
                         for f in parsed.faults)
            if newer and not frozen:
                problems.append(f"started after a newer attempt: job {job}'s run\n    {old}\n  began after\n    "
                                f"{newer[0]}\n  and its process was not frozen in between")
    return problems


def idle_workers(parsed: Parsed) -> list[str]:
    if parsed.probe is None:
        return []
    jobs = set(parsed.probe["jobs"])
    took = {run.pid for run in parsed.runs if run.job in jobs}
    return [f"worker idle: process {pid} ran none of the {len(jobs)} probe jobs sent once every job had finished "
            f"(its threads or its consumer ended?)" for pid in parsed.probe["pids"] if pid not in took]


def sends_hung(parsed: Parsed) -> list[str]:
    return [f"a send took {send['took']:.1f}s: {send}" for send in parsed.sends
            if send["took"] is not None and send["took"] > SEND_LIMIT]


def overlapping(faults: list[Fault]) -> int:
    """Faults that began while another one was still going (a worker frozen, a server down)."""
    spans = [f for f in faults if f.kind != "died"]
    return sum(1 for f in spans if any(g is not f and g.begin < f.begin <= g.end for g in spans))


def check(events: Iterable[dict], rows: list[Any], *, ttl_ms: float) -> tuple[list[str], dict]:
    """Every verdict on ``events`` (the history) and ``rows`` (the job table, after the recovery):
    ``(violations, figures)``."""
    parsed = parse(events)
    figures: dict[str, Any] = {}
    problems = stuck_or_lost(parsed, rows)
    problems += overlap_within_live_leases(parsed, ttl_ms)
    problems += overlap_unfenced(parsed)
    problems += reruns(parsed, ttl_ms, figures)
    problems += steps_redone(parsed)
    problems += ran_after_success(rows)
    problems += started_after_newer(parsed)
    problems += sends_hung(parsed)
    problems += idle_workers(parsed)
    accepted = [s for s in parsed.sends if s["returned"] is not None]
    figures.update(
        jobs=len(rows), sends=len(parsed.sends), accepted=len(accepted),
        duplicates=sum(1 for s in accepted if s["returned"] != s["built"]),
        refused=sum(1 for s in parsed.sends if s["error"] is not None), runs=len(parsed.runs),
        faults=dict(sorted(Counter(f.kind for f in parsed.faults if f.kind != "died").items())),
        died=sum(1 for f in parsed.faults if f.kind == "died"), violations=len(problems),
        overlapping=overlapping(parsed.faults),
    )
    if parsed.healed is not None:
        ends = [r.until for r in parsed.runs if r.done is not None]
        figures["drain_s"] = round(max(0.0, max(ends, default=parsed.healed) - parsed.healed), 1)
    return problems, figures
