"""The pages (GET): overview, jobs, a job, locks, slots, the dead set, read through the ops layer as
the command line reads them.  A store that does not answer is named on the page (``down``).  How they
show values: Jinja filters (times, durations, user data cut short; autoescaping makes any markup in it
text), and the layouts of the inline SVG charts (no script: a strict CSP holds)."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Callable, Optional, Sequence

from flask import abort, current_app, g, render_template, request

from dramatiq_unique import ops
from dramatiq_unique import suite as _config
from dramatiq_unique.errors import JobNotFound
from dramatiq_unique.ops import words
from dramatiq_unique.ops.detail import moment
from dramatiq_unique.ops.views import JobView
from dramatiq_unique.ops.words import MAX_DETAIL
from dramatiq_unique.storage.models import WAITING, JobStatus, utcnow
from dramatiq_unique.suite import Suite

#: ``?since=`` choices of the jobs page.
SINCE = {"5m": timedelta(minutes=5), "1h": timedelta(hours=1), "24h": timedelta(days=1), "7d": timedelta(days=7)}
#: Minutes the overview's chart covers.
MINUTES = 30
#: What an action's redirect may say (``?done=``): fixed words, never text from the request, but for
#: the counts of a bulk action (``n``, ``blocked``: whole numbers, or nothing is said of them).
DONE = {
    "retried": "The job was sent again.", "cancelled": "The job was cancelled.", "limit": "The limit was set.",
    "default": "The group is back to its default limit.", "halted": "The group is halted: its jobs stay parked.",
    "retried_all": "{n} dead jobs are due again: the re-drive sends them.",
    "cancelled_all": "{n} waiting jobs were cancelled.",
}
#: Said after a bulk retry that left jobs in the dead set.
BLOCKED = " {blocked} stay in the dead set: another job holds their key."
#: Characters a filter field may hold (a longer one is refused, not cut).
MAX_FILTER = 200


def current_suite() -> "Suite":
    """The suite this request shows: the app's own, else the last set-up's (looked up once a request)."""
    suite = current_app.config["DU_SUITE"]
    if suite is None and "du_suite" not in g:
        g.du_suite = _config.current()
    return suite if suite is not None else g.du_suite


def filters(names: tuple[str, ...], source: Any) -> dict[str, Any]:
    """The filter fields ``names`` a page or a form gives (``since`` one of :data:`SINCE`), those left blank out."""
    found: dict[str, Any] = {}
    for name in names:
        value = str(source.get(name, "")).strip()
        if len(value) > MAX_FILTER:
            abort(400, f"{name} is too long")
        if value:
            found[name] = value
    if "since" in found and found["since"] not in SINCE:
        abort(400, f"since must be one of {', '.join(SINCE)}")
    return found


def since(found: dict[str, Any]) -> Optional[datetime]:
    return utcnow() - SINCE[found["since"]] if "since" in found else None


def _count(name: str) -> Optional[int]:
    value = request.args.get(name, "")
    return int(value) if value.isdigit() and len(value) < 19 else None


def _done() -> Optional[str]:
    text = DONE.get(request.args.get("done", ""))
    if text is None or "{n}" not in text:
        return text
    n, blocked = _count("n"), _count("blocked")
    said = text.format(n=f"{n:,}" if n is not None else "The")
    return said + (BLOCKED.format(blocked=f"{blocked:,}") if blocked else "")


def overview() -> str:
    stats = ops.stats(current_suite(), minutes=MINUTES)
    drawn = bars(stats.throughput, end=utcnow().replace(second=0, microsecond=0) + timedelta(minutes=1))
    return render_template("overview.html", stats=stats, chart=drawn, down=stats.down, done=_done())


def jobs() -> str:
    query = filters(("status", "actor", "key", "since"), request.args)
    cursor = filters(("cursor",), request.args).get("cursor")
    try:
        page = ops.jobs(current_suite(), status=query.get("status"), actor=query.get("actor"), key=query.get("key"),
                        since=since(query), limit=current_app.config["DU_PAGE_SIZE"], cursor=cursor)
    except ValueError as e:
        abort(400, str(e))
    return render_template("jobs.html", page=page, filters=query, query=query, statuses=[s.value for s in JobStatus],
                           since_choices=list(SINCE), actors=sorted(current_suite().actors), cursor=cursor,
                           waiting=WAITING, down=page.down, done=_done())


def job(ref: str) -> str:
    try:
        view = ops.job(current_suite(), ref)
    except (JobNotFound, ValueError):  # ValueError: ``ref`` cannot be an id
        abort(404, f"no job {ref}")
    return render_template("job.html", job=view, timeline=timeline(view), waiting=WAITING, done=_done())


def locks() -> str:
    return render_template("locks.html", locks=ops.locks(current_suite()), done=_done())


def slots() -> str:
    suite = current_suite()
    return render_template("slots.html", groups=ops.slots(suite), limits=ops.limits(suite), done=_done())


def dead() -> str:
    actor = filters(("actor",), request.args).get("actor")
    suite, size = current_suite(), current_app.config["DU_PAGE_SIZE"]
    rows = ops.dead(suite, actor=actor, limit=size)
    retrying = ops.jobs(suite, status="retrying", actor=actor, limit=size)
    return render_template("dead.html", rows=rows, retrying=retrying, actor=actor or "",
                           actors=sorted(suite.actors), down=retrying.down, done=_done())


#: (rule, endpoint, view, method, action) of every page, as :data:`dramatiq_unique.web.actions.ROUTES`.
ROUTES: list[tuple[str, str, Any, str, None]] = [
    ("/", "overview", overview, "GET", None), ("/jobs", "jobs", jobs, "GET", None),
    ("/jobs/<ref>", "job", job, "GET", None), ("/locks", "locks", locks, "GET", None),
    ("/slots", "slots", slots, "GET", None), ("/dead", "dead", dead, "GET", None),
]


#: Characters of a value shown in a table cell.
MAX_CELL = 120
cell = functools.partial(words.one_line, most=MAX_CELL)
#: The overview's chart, px.
WIDTH, HEIGHT, GAP = 600, 120, 2
#: Width of the attempts timeline, px; attempts beyond the last :data:`MAX_ATTEMPTS` are not drawn.
TIMELINE_WIDTH, MAX_ATTEMPTS = 600, 50
#: Height of an attempt's span, px (a row is 18).
SPAN_HEIGHT = 14


def detail(value: Any) -> str:
    """A value as indented JSON (a str as it is), cut to :data:`MAX_DETAIL` characters."""
    if value is None:
        return ""
    return words.cut(value if isinstance(value, str) else words.as_json(value, indent=2), MAX_DETAIL)


def ago(value: Optional[datetime], now: Optional[datetime] = None) -> str:
    """How long ago (or, for a time ahead, in how long): ``12 s ago``, ``in 3 min``."""
    if not isinstance(value, datetime):
        return ""
    seconds = ((now or utcnow()) - value).total_seconds()
    text = words.duration(abs(seconds) * 1000)
    return f"{text} ago" if seconds >= 0 else f"in {text}"


def status_class(status: Any) -> str:
    """A CSS class per status (only letters: a strange status cannot break the attribute)."""
    text = str(getattr(status, "value", status) or "")
    return "st-" + ("".join(c for c in text if c.isalpha()) or "none")


FILTERS: dict[str, Callable[..., Any]] = {
    "cell": cell, "first_line": words.first_line, "detail": detail, "when": words.when, "ago": ago,
    "duration": functools.partial(words.duration, none=""), "status_class": status_class,
}


@dataclass(frozen=True)
class Rect:
    """A bar of the overview's chart, or an attempt's wait or run on a job's timeline (``css`` its class)."""

    x: float
    y: float
    width: float
    height: float
    label: str
    css: str = "bar"


@dataclass(frozen=True)
class Chart:
    bars: list[Rect]
    peak: int
    total: int
    width: int = WIDTH
    height: int = HEIGHT


def bars(values: Sequence[int], end: Optional[datetime] = None) -> Chart:
    """One bar per minute, the oldest first; ``end`` (naive UTC) is the end of the last minute,
    for the labels (``22:07: 41 jobs``)."""
    count = len(values)
    peak = max(values, default=0)
    slot = WIDTH / count if count else WIDTH
    laid = []
    for index, value in enumerate(values):
        high = 0.0 if value <= 0 else max(1.0, (HEIGHT - 14) * value / peak)  # a non-zero minute stays visible
        label = f"{value} jobs" if end is None else f"{end - timedelta(minutes=count - index):%H:%M}: {value} jobs"
        laid.append(Rect(round(index * slot + GAP / 2, 1), round(HEIGHT - high, 1), round(max(slot - GAP, 1), 1),
                        round(high, 1), label))
    return Chart(laid, peak, int(sum(values)))


def timeline(job: "JobView", now: Optional[datetime] = None) -> list[Rect]:
    """The job's attempts laid out on one time axis, from its creation to its end (or now): for
    each, the time it waited (``a-wait``) and the time it ran (coloured by its outcome)."""
    timed = [(a, moment(a.started_at), moment(a.finished_at)) for a in job.history]
    attempts = [(a, began, ended) for a, began, ended in timed if began is not None][-MAX_ATTEMPTS:]
    if not attempts:
        return []
    start = min(job.created_at or attempts[0][1], attempts[0][1])
    ends = [ended for _, _, ended in attempts if ended is not None]
    end = max([*ends, job.finished_at or start, *([now or utcnow()] if len(ends) < len(attempts) else [])])
    total = max((end - start).total_seconds(), 0.001)
    spans = []
    waited_from = start
    for row, (attempt, began, ended) in enumerate(attempts):
        # What the attempt waited for (since the job was created, or since the attempt before ended).
        waited = max((began - waited_from).total_seconds(), 0.0)
        if waited > 0:
            spans.append(Rect(round(TIMELINE_WIDTH * (waited_from - start).total_seconds() / total, 1), row * 18,
                              round(max(TIMELINE_WIDTH * waited / total, 1.0), 1), SPAN_HEIGHT,
                              f"attempt {attempt.attempt}: waited {waited * 1000:.0f} ms", "a-wait"))
        waited_from = ended or end
        length = max(((ended or end) - began).total_seconds(), 0.0)
        status = attempt.status or "other"
        css = "a-" + (status if status in ("succeeded", "failed", "retrying", "running") else "other")
        label = f"attempt {attempt.attempt}: {status}, {length * 1000:.0f} ms"
        spans.append(Rect(round(TIMELINE_WIDTH * (began - start).total_seconds() / total, 1), row * 18,
                          round(max(TIMELINE_WIDTH * length / total, 2.0), 1), SPAN_HEIGHT, label, css))
    return spans
