"""What an operator reads in words: a job's key (``customer=42``), rendered from its row and its
actor's options (Redis holds only hashes), and why a job waits, from the facts of a
:class:`~dramatiq_unique.ops.views.Waiting`."""

from __future__ import annotations

import contextlib
import json
import time
import weakref
from datetime import datetime
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

from dramatiq_unique.ops.views import Waiting
from dramatiq_unique.unique.keys import bind_arguments, canonical

if TYPE_CHECKING:
    from dramatiq_unique.storage.models import JobModel
    from dramatiq_unique.suite import ActorConfig

#: ms a key callable may take before it is shown as its hash from then on (in this process).
SLOW_CALLABLE_MS = 20
#: Characters of a rendered value kept, and of a hash shown when there are no words for it.
MAX_VALUE = 60
SHORT_HASH = 12
#: Characters of a value (arguments, result, error) shown on a view of one job, by the dashboard and the command line.
MAX_DETAIL = 20_000

# Weakly held, so that a new callable never inherits a dead one's verdict through a reused id().
_slow: "weakref.WeakSet[Any]" = weakref.WeakSet()


def cut(text: str, most: int) -> str:
    return text if len(text) <= most else text[: most - 1] + "…"


def as_json(value: Any, indent: Optional[int] = None) -> str:
    try:
        return json.dumps(value, indent=indent, sort_keys=True, default=repr, ensure_ascii=False)
    except (TypeError, ValueError):  # a cycle, a key JSON cannot write: the repr says enough
        return repr(value)


def when(value: Optional[datetime]) -> str:
    """A naive UTC time as ``2026-11-24 22:10:05``."""
    return value.strftime("%Y-%m-%d %H:%M:%S") if isinstance(value, datetime) else ("" if value is None else str(value))


def one_line(value: Any, most: int, none: str = "") -> str:
    """A value on one line, for a table's cell: a time to the second, a list's items joined (whole: a cell
    cuts no list), a str as it is and anything else as JSON, cut to ``most`` characters."""
    if value is None:
        return none
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value) or none
    text = when(value) if isinstance(value, datetime) else value if isinstance(value, str) else as_json(value)
    return cut(" ".join(text.split()), most)


def value_text(value: Any) -> str:
    """One argument's value in words: a str bare (``acme``), the rest as JSON (``42``, ``[1,2]``)."""
    return cut(value if isinstance(value, str) else canonical(value), MAX_VALUE)


def short(key: Optional[str]) -> str:
    """A hashed key (``actor:0ef2770d…``) cut to ``#0ef2770d1a2b``."""
    return "#" + key.rsplit(":", 1)[-1][:SHORT_HASH] if key else ""


def _call(spec: Callable[..., Any], args: list, kwargs: dict) -> Optional[str]:
    if spec in _slow:  # False for a callable that takes no weak reference: it is never remembered as slow
        return None
    began = time.monotonic()
    try:
        result = spec(*args, **kwargs)
    except Exception:  # the operator's view must not fail on a user's callable: the hash is shown
        return None
    if (time.monotonic() - began) * 1000 > SLOW_CALLABLE_MS:
        with contextlib.suppress(TypeError):  # a callable that takes no weak reference
            _slow.add(spec)
    return result if isinstance(result, str) else None


def render(config: Optional["ActorConfig"], option: str, row: "JobModel", hashed: Optional[str] = None) -> str:
    """The key ``option`` (``unique_args`` or ``concurrency_key``) gives ``row``, in words; ``hashed``
    cut short when there are none (an actor not declared here, arguments that no longer bind)."""
    if config is None:
        return short(hashed)
    spec = getattr(config.for_message(row.options or {}), option)
    if spec is None or spec is False:
        return ""
    args, kwargs = list(row.args or []), dict(row.kwargs or {})
    if callable(spec):
        text = _call(spec, args, kwargs)
        return short(hashed) if text is None else value_text(text)
    try:
        bound = bind_arguments(config.fn, tuple(args), kwargs)
    except Exception:  # arguments of an older signature: the hash is all there is
        return short(hashed)
    selected = bound if spec is True else {name: bound.get(name) for name in spec}
    return " ".join(f"{name}={value_text(value)}" for name, value in selected.items())


def row_key(config: Optional["ActorConfig"], row: "JobModel") -> str:
    """A row's key in words: its unique key's, else its slot group's; '' if it has neither."""
    if row.unique_key or (config is not None and config.options.get("unique_args") is not None):
        text = render(config, "unique_args", row, row.unique_key)
        if text:
            return text
    return render(config, "concurrency_key", row) if config is not None else ""


def duration(ms: Optional[float], none: str = "?") -> str:
    """ms in one rounded unit: ``850 ms``, ``41 s``, ``3 m``, ``2 h``, ``4 d``; ``none`` for None."""
    if ms is None:
        return none
    ms = max(float(ms), 0.0)
    # Each unit from twice its size down (90 s for minutes), so "41 s" and "75 s" stay exact enough.
    for unit, size, start in (("d", 86_400_000, 2), ("h", 3_600_000, 2), ("m", 60_000, 1.5), ("s", 1_000, 1)):
        if ms >= size * start:
            return f"{round(ms / size)} {unit}"
    return f"{round(ms)} ms"


def first_line(text: Optional[str]) -> str:
    """The first line of an error (its type and message; the traceback stays in the row)."""
    text = (text or "").strip()
    return text.splitlines()[0] if text else ""


def _since(moment: Optional[datetime], now: Optional[datetime]) -> str:
    if moment is None:
        return "?"
    text = when(moment) + " UTC"
    return text if now is None else f"{text} ({duration((now - moment).total_seconds() * 1000)})"


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
    limit, so the limit went down while they held theirs."""
    if limit is None or held <= limit:
        return ""
    return f"{held} held, " + ("halted while they ran" if limit == 0 else f"limit lowered to {limit} while they ran")


def holding(label: str, held: int, limit: Optional[int], holders: Sequence[int]) -> str:
    """A holder's slot line: "holds a slot of <label>: 2 of 3 held (jobs 17 and 23)"."""
    names = f" ({job_list(holders, held)})" if held else ""
    over = over_limit(held, limit)
    if over:
        return f"holds a slot of {label}: {over.replace(' held,', ' held' + names + ',', 1)}"
    count = f"{held} held, no limit" if limit is None else f"{held} of {limit} held"
    return f"holds a slot of {label}: {count}{names}"


def _ahead(w: Waiting) -> str:
    return "first in line" if w.ahead == 0 else f"{w.ahead}{'+' if w.ahead_more else ''} waiting ahead"


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
        # None held: no holder will hand a slot on; the group's wake-up (or the re-drive) starts one.
        held = f"held by {job_list(w.holders, w.held)}" if w.held else "held (a wake-up or the re-drive starts one)"
        if over_limit(w.held, w.limit):
            held += f" (limit lowered to {w.limit} while they ran)" if w.limit else " (halted while they ran)"
        return f"waiting for a slot{of}: {count} {held}; {_ahead(w)}"
    if w.reason == "woken":
        return (f"woken with a slot{of}, which it holds: queued since {_since(w.since, now)} "
                "for a worker thread to start it")
    if w.reason == "halted":
        return f"waiting for a slot{of}: the group is halted (limit 0; `limit` restores it); {_ahead(w)}"
    if w.reason == "lock":
        if w.holders or w.held:
            token = f"token {w.token}, " if w.token is not None else ""
            holder = f"held by {job_list(w.holders, w.held)} ({token}{duration(w.left_ms)} left)"
        else:
            holder = "free now (the next hand-over or the watchdog starts the first in line)"
        return f"waiting for the execution lock{of}: {holder}; {_ahead(w)}"
    if w.reason == "due":
        return f"due in {duration(w.due_in_ms)}"
    if w.reason == "retrying":
        if w.due_in_ms is not None and w.due_in_ms <= 0:
            return f"failed, retrying: next attempt overdue by {duration(-w.due_in_ms)}"
        return f"failed, retrying: next attempt due in {duration(w.due_in_ms)}"
    if w.reason == "queued":
        return f"queued since {_since(w.since, now)}"
    return (f"pending since {_since(w.since, now)}: not yet in the broker (a transaction to commit, "
            "or the re-drive sends it)")
