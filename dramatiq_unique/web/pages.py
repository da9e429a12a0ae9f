"""The pages (GET): overview, jobs, a job, locks, slots, the dead set, read through the ops layer as
the command line reads them.  A store that does not answer is named on the page (``down``)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Optional

from flask import abort, current_app, g, render_template, request

from dramatiq_unique import ops
from dramatiq_unique import suite as _config
from dramatiq_unique.errors import JobNotFound
from dramatiq_unique.storage.models import WAITING, JobStatus, utcnow
from dramatiq_unique.web import present

if TYPE_CHECKING:
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
    drawn = present.bars(stats.throughput, end=utcnow().replace(second=0, microsecond=0) + timedelta(minutes=1))
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
    return render_template("job.html", job=view, timeline=present.timeline(view), waiting=WAITING,
                           done=_done())


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
