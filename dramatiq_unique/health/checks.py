"""The ``check`` command's findings and their severities (docs/operations/health-check.md); a check whose
service is down reports nothing of its own: that service's finding says why."""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Optional

import peewee as pw
import redis as redis_lib

from dramatiq_unique.health.target import Target, schema_tables, tables
from dramatiq_unique.redaction import redact
from dramatiq_unique.redis.servers import eviction, replica_of
from dramatiq_unique.storage import migrations, schema
from dramatiq_unique.storage.database import clock_skew
from dramatiq_unique.storage.models import WAITING, JobStatus, after_ms

OK, WARNING, CRITICAL = 0, 1, 2
NAMES = {OK: "ok", WARNING: "warning", CRITICAL: "critical"}
#: ms a waiting row may be overdue, or a running row's lease run out, before it is reported.
DEFAULT_OVERDUE_AFTER = 300_000
#: The last re-drive pass may be at most this many intervals old (and at least a minute).
PASS_AGE_INTERVALS = 6
#: ms between the two looks at a parked group's gate (a gate is free for an instant at every hand-over).
DEFAULT_RECHECK = 300
#: Rows or groups named in a finding at most (the count is whole).
SAMPLE = 5


@dataclasses.dataclass
class Finding:
    check: str
    severity: int
    detail: str
    data: dict[str, Any] = dataclasses.field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"check": self.check, "severity": NAMES[self.severity], "detail": self.detail, **self.data}


@dataclasses.dataclass
class Report:
    findings: list[Finding]

    @property
    def code(self) -> int:
        return max((f.severity for f in self.findings), default=OK)

    def as_dict(self) -> dict[str, Any]:
        return {"status": NAMES[self.code], "code": self.code, "findings": [f.as_dict() for f in self.findings]}


def _first_line(error: BaseException) -> str:
    text = redact(str(error).strip())  # a driver's error may quote the connection string
    return f"{type(error).__name__}: {text.splitlines()[0] if text else ''}"[:300]


def databases(target: Target) -> tuple[list[Finding], set[int]]:
    """The ``database`` and ``schema`` findings; and the stores that answered."""
    findings, up = [], set()
    for index, db in enumerate(target.databases):
        name = target.store_name(index)
        try:
            db.connect(reuse_if_open=True)
            db.execute_sql("SELECT 1").fetchone()
            skew = clock_skew(db)
        except pw.DatabaseError as e:
            findings.append(Finding("database", CRITICAL if index == 0 else WARNING,
                                    f"{name} does not answer: {_first_line(e)}", {"store": index}))
            if not db.in_transaction():
                db.close()
        else:
            up.add(index)
            findings.append(Finding("database", OK, f"{name} answers", {"store": index}) if skew is None
                            else Finding("database", WARNING, f"{name} answers; {skew}", {"store": index}))
    for index, model in schema_tables(target):
        if index not in up:
            continue
        status = migrations.status(model, target.store_name(index))
        data = {"store": index, "table": status.table, "version": status.version, "target": status.target}
        if status.version is None:
            severity, detail = WARNING, "does not exist yet (set-up creates it)"
        elif not status.current:
            severity, detail = CRITICAL, f"is at version {status.version} of {status.target}: run {schema.COMMAND}"
        else:
            severity, detail = OK, f"is at version {status.version}"
        findings.append(Finding("schema", severity, f"{status.table} in {status.store} {detail}", data))
    return findings, up


def redis_masters(target: Target) -> Finding:
    errors, risks = [], []
    for i, client in enumerate(target.masters):
        try:
            client.ping()
            if (master := replica_of(client)) is not None:
                errors.append(f"master {i}: a replica of {master}")
            elif (risk := eviction(client)) is not None:
                risks.append(f"master {i}: {risk}")
        except redis_lib.RedisError as e:
            errors.append(f"master {i}: {_first_line(e)}")
    total = len(target.masters)
    if not total:
        return Finding("redis", WARNING, "no Redis named (set DRAMATIQ_UNIQUE_REDIS_URL)")
    answered, quorum = total - len(errors), total // 2 + 1
    detail = f"{answered} of {total} Redis masters answer"
    if answered < quorum:
        severity, detail = CRITICAL, f"{detail}, {quorum} needed: " + "; ".join(errors)
    else:
        severity = WARNING if errors or risks else OK
        detail += f" (quorum {quorum}): " + "; ".join(errors + risks) if errors or risks else ""
    return Finding("redis", severity, detail, {"answered": answered, "masters": total, "quorum": quorum})


def last_pass(target: Target, max_age: Optional[float] = None) -> Optional[Finding]:
    """None if no master answers (the ``redis`` finding says so)."""
    limit = max_age if max_age is not None else max(60_000, PASS_AGE_INTERVALS * target.redrive_interval)
    for client in target.masters:
        try:
            value = client.get(target.keys.last_pass())
        except redis_lib.RedisError:
            continue
        if value is None:
            return Finding("redrive", WARNING, f"no re-drive pass recorded for app {target.app!r}: is one running "
                           "(start_redriver(), the Redriver middleware or `redrive APP`)?", {"age_ms": None})
        age = time.time() * 1000 - int(value)
        data = {"age_ms": int(age), "max_age_ms": int(limit)}
        if age > limit:
            return Finding("redrive", WARNING, f"the last re-drive pass ended {age / 1000:.0f} s ago "
                           f"(more than {limit / 1000:.0f} s)", data)
        return Finding("redrive", OK, f"the last re-drive pass ended {age / 1000:.1f} s ago", data)
    return None


def overdue(target: Target, up: set[int], overdue_after: float = DEFAULT_OVERDUE_AFTER) -> list[Finding]:
    findings = []
    cutoff = after_ms(-overdue_after)
    # A lost retry is sent lost_after after it was due, at the re-drive's next pass or the one after.
    retry_after = min(overdue_after, target.lost_after + 2 * target.redrive_interval)
    retry_cutoff = after_ms(-retry_after)
    for index, model in tables(target):
        if index not in up:
            continue
        mine, table = model.app == target.app, model._meta.table_name
        waiting = mine & model.parked_on.is_null()
        due = pw.fn.COALESCE(model.process_after, model.created_at)
        not_retrying = [status for status in WAITING if status != JobStatus.RETRYING.value]
        for kind, cond, after in (
            ("waiting", waiting & model.status.in_(not_retrying) & (due < cutoff), overdue_after),
            ("retrying", waiting & (model.status == JobStatus.RETRYING.value) & (due < retry_cutoff), retry_after),
            ("running", mine & (model.status == JobStatus.RUNNING.value) & (model.lease_until < cutoff), overdue_after),
        ):
            count = model.select().where(cond).count()
            if count:
                ids = [row.id for row in model.select(model.id).where(cond).order_by(model.id).limit(SAMPLE)]
                what = "with their lease run out" if kind == "running" else "due"
                findings.append(Finding(
                    "overdue", WARNING, f"{count} {kind} job(s) of {table} in {target.store_name(index)} {what} "
                    f"more than {after / 1000:g} s ago (e.g. {ids})",
                    {"store": index, "table": table, "kind": kind, "count": count, "overdue_after_ms": int(after),
                     "ids": ids}))
    if not findings:
        findings.append(Finding("overdue", OK, "no overdue jobs", {"overdue_after_ms": overdue_after}))
    return findings


def parked(target: Target, recheck: float = DEFAULT_RECHECK) -> Finding:
    if target.suite is None:
        return Finding("parked", OK, "not checked: the gates of parked jobs are known from the app (give APP)",
                       {"checked": False})
    from dramatiq_unique.parking import lot

    first = set(lot.of(target.suite).orphans())
    if first:
        time.sleep(recheck / 1000)
        first &= set(lot.of(target.suite).orphans())
    groups = sorted(first)
    if groups:
        return Finding("parked", WARNING, f"{len(groups)} group(s) with parked jobs and no live holder (the "
                       f"re-drive wakes them): {groups[:SAMPLE]}", {"groups": groups[:SAMPLE], "count": len(groups)})
    return Finding("parked", OK, "every group with parked jobs has a live holder", {"checked": True})


def run(
    target: Target, *, overdue_after: float = DEFAULT_OVERDUE_AFTER, max_pass_age: Optional[float] = None,
    recheck: float = DEFAULT_RECHECK,
) -> Report:
    findings, up = databases(target)
    redis_finding = redis_masters(target)
    findings.append(redis_finding)
    if redis_finding.data.get("answered", 0) > 0 and (found := last_pass(target, max_pass_age)) is not None:
        findings.append(found)
    findings += _guarded("overdue", lambda: overdue(target, up, overdue_after))
    if 0 in up and redis_finding.severity < CRITICAL:
        findings += _guarded("parked", lambda: [parked(target, recheck)])
    return Report(findings)


def _guarded(check: str, make: Any) -> list[Finding]:
    # A service lost between two findings: its own finding has said so, or this one does now.
    try:
        return list(make())
    except (pw.DatabaseError, redis_lib.RedisError, OSError) as e:
        return [Finding(check, CRITICAL, f"could not look: {_first_line(e)}")]
