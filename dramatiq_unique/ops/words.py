"""Why a job waits, in words, from the facts :mod:`dramatiq_unique.ops.gates` gathers.

Pure functions of a :class:`~dramatiq_unique.ops.views.Waiting` and the
current time, so each sentence is tested without a store:

* "waiting for a slot of deliver_webhook customer=42: 2 of 2 held by jobs 17 and 23; 5 waiting ahead"
* "waiting for the execution lock of report user=7: held by job 12 (token 7, 41 s left); 2 waiting ahead"
* "due in 3 m", "queued since 2026-11-24 21:03:12 UTC (4 m)"
* "holds a slot of deliver_webhook customer=42: 3 held (jobs 17, 23 and 31), limit lowered to 1 while they ran"
* "failed, retrying: next attempt overdue by 2 m" (its due time passed and no worker took it yet)
"""

from __future__ import annotations

from datetime import datetime
from typing import Optional, Sequence

from dramatiq_unique.ops.views import Waiting


def duration(ms: Optional[float]) -> str:
    """ms in one rounded unit: ``850 ms``, ``41 s``, ``3 m``, ``2 h``, ``4 d``."""
    if ms is None:
        return "?"
    ms = max(float(ms), 0.0)
    # Each unit from twice its size down (90 s for minutes), so "41 s" and "75 s" stay exact enough.
    for unit, size, start in (("d", 86_400_000, 2), ("h", 3_600_000, 2), ("m", 60_000, 1.5), ("s", 1_000, 1)):
        if ms >= size * start:
            return f"{round(ms / size)} {unit}"
    return f"{round(ms)} ms"


def when(moment: Optional[datetime]) -> str:
    return "?" if moment is None else moment.replace(microsecond=0).isoformat(sep=" ") + " UTC"


def job_list(ids: Sequence[int], held: int) -> str:
    """``job 12``, ``jobs 17 and 23``, ``jobs 1, 2 and 3``; the holders no row names are counted."""
    names = [str(i) for i in ids]
    unknown = held - len(names)
    if unknown > 0:
        plural = "s" if unknown > 1 else ""
        names.append(f"{unknown} unknown" if names else f"{unknown} job{plural} not in the job tables")
        if len(names) == 1:
            return names[0]
    if not names:
        return "nobody"
    text = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
    return ("job " if len(ids) == 1 and unknown <= 0 else "jobs ") + text


def over_limit(held: int, limit: Optional[int]) -> str:
    """Why more hold a group than its limit allows ('' when they do not): no slot is taken over the
    limit, so the limit went down while they held theirs; nothing new starts until they are fewer."""
    if limit is None or held <= limit:
        return ""
    if limit == 0:
        return f"{held} held, halted while they ran"
    return f"{held} held, limit lowered to {limit} while they ran"


def holding(label: str, held: int, limit: Optional[int], holders: Sequence[int], limit_from: str = "") -> str:
    """A holder's slot line: "holds a slot of <label>: 2 of 3 held (jobs 17 and 23)"."""
    names = f" ({job_list(holders, held)})" if held else ""
    over = over_limit(held, limit)
    if over:
        return f"holds a slot of {label}: {over.replace(' held,', ' held' + names + ',', 1)}"
    if limit is None:
        count = f"{held} held, limit not known here" if limit_from == "unknown" else f"{held} held, no limit"
    else:
        count = f"{held} of {limit} held"
    return f"holds a slot of {label}: {count}{names}"


def ahead_text(w: Waiting) -> str:
    if w.ahead == 0:
        return "first in line"
    return f"{w.ahead}{'+' if w.ahead_more else ''} waiting ahead"


def why(w: Optional[Waiting], now: Optional[datetime] = None) -> str:
    """The sentence for ``w`` ('' for None: the job does not wait)."""
    if w is None:
        return ""
    text = _sentence(w, now)
    return f"{text} ({w.note})" if w.note else text


def _sentence(w: Waiting, now: Optional[datetime]) -> str:
    of = f" of {w.label}" if w.label else ""
    if w.note and w.reason in ("slot", "lock"):  # the facts could not be read: only what it waits for
        return f"waiting for {'a slot' if w.reason == 'slot' else 'the execution lock'}{of}"
    if w.reason == "slot":
        count = f"{w.held} (no limit)" if w.limit is None else f"{w.held} of {w.limit}"
        # None held: no holder will hand a slot on; the group's wake-up (or the re-drive, for a group
        # whose holder died) starts the first in line.
        held = f"held by {job_list(w.holders, w.held)}" if w.held else "held (a wake-up or the re-drive starts one)"
        over = over_limit(w.held, w.limit)
        if over:
            held += f" (limit lowered to {w.limit} while they ran)" if w.limit else " (halted while they ran)"
        return f"waiting for a slot{of}: {count} {held}; {ahead_text(w)}"
    if w.reason == "woken":
        since = when(w.since)
        if w.since is not None and now is not None:
            since += f" ({duration((now - w.since).total_seconds() * 1000)})"
        return (f"woken with a slot{of}, which it holds: queued since {since} for a worker thread to start it")
    if w.reason == "halted":
        return f"waiting for a slot{of}: the group is halted (limit 0; `limit` restores it); {ahead_text(w)}"
    if w.reason == "lock":
        if w.holders or w.held:
            token = f"token {w.token}, " if w.token is not None else ""
            holder = f"held by {job_list(w.holders, w.held)} ({token}{duration(w.left_ms)} left)"
        else:
            holder = "free now (the next hand-over or the watchdog starts the first in line)"
        return f"waiting for the execution lock{of}: {holder}; {ahead_text(w)}"
    if w.reason == "due":
        return f"due in {duration(w.due_in_ms)}"
    if w.reason == "retrying":
        if w.due_in_ms is not None and w.due_in_ms <= 0:
            return f"failed, retrying: next attempt overdue by {duration(-w.due_in_ms)}"
        return f"failed, retrying: next attempt due in {duration(w.due_in_ms)}"
    since = when(w.since)
    if w.since is not None and now is not None:
        since += f" ({duration((now - w.since).total_seconds() * 1000)})"
    if w.reason == "queued":
        return f"queued since {since}"
    return f"pending since {since}: not yet in the broker (a transaction to commit, or the re-drive sends it)"
