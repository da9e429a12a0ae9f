"""``stats``: counts by status and actor, throughput, and p50/p95 of waiting, parked and running times,
bounded on a table of millions: open jobs are counted through the ``(app, status, ...)`` indexes,
finished ones within the window through ``(app, finished_at)``, and the timings come from the newest
:data:`MAX_SAMPLE` jobs finished in it (percentiles in SQL on PostgreSQL, in Python on SQLite)."""

from __future__ import annotations

import statistics
from datetime import timedelta
from typing import Any, Optional

import peewee as pw

from dramatiq_unique.durable import lookup
from dramatiq_unique.durable.scope import NO_APP
from dramatiq_unique.ops.views import Stats
from dramatiq_unique.storage import queries
from dramatiq_unique.storage.database import is_postgres
from dramatiq_unique.storage.models import FINISHED, WAITING, JobModel, JobStatus, utcnow
from dramatiq_unique.suite import Suite

#: Finished jobs the timings are taken from, at most (the newest of the window).
MAX_SAMPLE = 10_000
#: The longest window, minutes (a day).
MAX_MINUTES = 1_440
OPEN = (*WAITING, JobStatus.RUNNING.value)

# Per dialect (is_postgres), the three timings of one row, ms: waiting, running, parked (NULL: not parked).
_COLUMNS = {True: """
EXTRACT(EPOCH FROM started_at - GREATEST(created_at, process_after)) * 1000 AS w,
EXTRACT(EPOCH FROM finished_at - started_at) * 1000 AS r,
CASE WHEN parked_attempt = attempts - 1 THEN EXTRACT(EPOCH FROM started_at - parked_at) * 1000 END AS p
""", False: """
(julianday(started_at) - julianday(MAX(created_at, COALESCE(process_after, created_at)))) * 86400000,
(julianday(finished_at) - julianday(started_at)) * 86400000,
CASE WHEN parked_attempt = attempts - 1 THEN (julianday(started_at) - julianday(parked_at)) * 86400000 END
"""}
_SAMPLE = """
SELECT {columns}
FROM {table} WHERE app IN ({p}, {p}) AND finished_at >= {p} AND started_at IS NOT NULL
ORDER BY finished_at DESC LIMIT {limit}
"""
_PG_TIMES = """
SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY w), percentile_cont(0.95) WITHIN GROUP (ORDER BY w),
       percentile_cont(0.5) WITHIN GROUP (ORDER BY r), percentile_cont(0.95) WITHIN GROUP (ORDER BY r),
       percentile_cont(0.5) WITHIN GROUP (ORDER BY p), percentile_cont(0.95) WITHIN GROUP (ORDER BY p),
       count(*), count(p)
FROM (""" + _SAMPLE + ") AS sample"
_THROUGHPUT = "SELECT {minute}, COUNT(*) FROM {table} WHERE app IN ({p}, {p}) AND finished_at >= {p} GROUP BY 1"
_MINUTE = {True: "date_trunc('minute', finished_at)", False: "strftime('%Y-%m-%d %H:%M', finished_at)"}


def percentile(values: list[float], fraction: float) -> Optional[float]:
    """The ``fraction`` percentile of ``values`` (a whole percent), interpolated as PostgreSQL's ``percentile_cont``."""
    if len(values) < 2:
        return values[0] if values else None
    return statistics.quantiles(values, n=100, method="inclusive")[round(fraction * 100) - 1]


def stats(suite: "Suite", *, minutes: int = 15) -> Stats:
    """Counts, throughput per minute and timings of the last ``minutes``.  Waiting: from when the job could
    first run (created, or due) to its last attempt's start; parked: from first parked to started."""
    if isinstance(minutes, bool) or not isinstance(minutes, int) or not 1 <= minutes <= MAX_MINUTES:
        raise ValueError(f"minutes must be a whole number from 1 to {MAX_MINUTES}, not {minutes!r}")
    now = utcnow().replace(second=0, microsecond=0) + timedelta(minutes=1)
    cutoff = now - timedelta(minutes=minutes)
    by_status: dict[str, int] = {}
    by_actor: dict[str, dict[str, int]] = {}
    per_minute = [0] * minutes
    pg_times: list[tuple[Any, ...]] = []
    samples: list[tuple[float, float, Optional[float]]] = []

    # PostgreSQL's percentiles only when its table is the only one: percentiles of two tables do not combine.
    single = len(suite.models) * len(suite.stores) == 1

    def read(index: int, tables: list[type[JobModel]]) -> None:
        for t in tables:
            apps = t.app.in_((suite.app, NO_APP))
            for cond in (apps & t.status.in_(OPEN), apps & t.status.in_(FINISHED) & (t.finished_at >= cutoff)):
                query: Any = t.select(t.status, t.actor_name, pw.fn.COUNT(t.id)).where(cond).group_by(
                    t.status, t.actor_name)
                for status, actor, n in query.tuples():
                    status = str(status.value if isinstance(status, JobStatus) else status)
                    by_status[status] = by_status.get(status, 0) + n
                    counts = by_actor.setdefault(actor, {})
                    counts[status] = counts.get(status, 0) + n
            for bucket, n in _run(suite, t, cutoff, _THROUGHPUT).fetchall():
                if isinstance(bucket, str):
                    bucket = type(now).fromisoformat(bucket)
                at = minutes - 1 - int((now - bucket).total_seconds() // 60 - 1)
                if 0 <= at < minutes:
                    per_minute[at] += n
            if is_postgres(t._meta.database) and single:
                row = _run(suite, t, cutoff, _PG_TIMES).fetchone()
                if row and row[6]:
                    pg_times.append(row)
            else:
                samples.extend((float(w), float(r), None if p is None else float(p))
                               for w, r, p in _run(suite, t, cutoff, _SAMPLE).fetchall()
                               if w is not None and r is not None)

    _, down = lookup.each_store(suite, "reading the stats", read)
    if pg_times:
        values = [None if v is None else float(v) for v in pg_times[0][:6]]
        timed, parked_jobs = pg_times[0][6:8]
    else:
        # Each timing's values (a negative one as 0); the parked ones of the parked jobs only.
        columns = [[max(value, 0.0) for sample in samples if (value := sample[i]) is not None] for i in range(3)]
        values = [percentile(c, fraction) for c in columns for fraction in (0.5, 0.95)]
        timed, parked_jobs = len(samples), len(columns[2])
    waiting, running, parked = ({"p50": values[i], "p95": values[i + 1]} for i in (0, 2, 4))
    return Stats(minutes, by_status, by_actor, per_minute, waiting, running, [str(e) for e in down],
                 parked_ms=parked, timed=timed, parked=parked_jobs)


def _run(suite: "Suite", t: type[JobModel], cutoff: Any, template: str) -> Any:
    """``template`` run on ``t``'s database, in its dialect (parameter marks, columns, minutes), for this
    app's rows finished since ``cutoff``."""
    db = t._meta.database
    pg = is_postgres(db)
    sql = template.format(p="%s" if pg else "?", columns=_COLUMNS[pg], minute=_MINUTE[pg], limit=MAX_SAMPLE,
                          table=queries.table(db, t._meta.table_name, t._meta.schema))
    return db.execute_sql(sql, (suite.app, NO_APP, cutoff))
