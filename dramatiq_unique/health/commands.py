"""The ``check``, ``status`` and ``migrate`` commands as functions of a :class:`Target` (registered in
``cli/cmd_health.py``); ``emit(data, text)`` prints ``data`` as JSON with ``--json``, else ``text()``."""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable, Optional

import peewee as pw

from dramatiq_unique.health import checks, probe
from dramatiq_unique.health.target import Target, schema_tables
from dramatiq_unique.redaction import redact
from dramatiq_unique.storage import migrations, schema

Emit = Callable[[Any, Callable[[], str]], None]


def check(
    target: Target, emit: Emit, *, overdue_after: float = checks.DEFAULT_OVERDUE_AFTER,
    max_pass_age: Optional[float] = None, probe_port: Optional[int] = None, probe_host: str = "0.0.0.0",
    say: Callable[[str], None] = print, probe_details: bool = False,
) -> int:
    """Print the findings, or with ``probe_port`` serve them over HTTP until interrupted (health/probe.py)."""
    report = functools.partial(checks.run, target, overdue_after=overdue_after, max_pass_age=max_pass_age)
    if probe_port is not None:
        server = probe.serve(report, probe_port, host=probe_host, details=probe_details)
        say(f"health probe on http://{probe_host}:{server.server_address[1]}/"
            + (" (with details: store addresses, job ids)" if probe_details else ""))
        with server, contextlib.suppress(KeyboardInterrupt):
            server.serve_forever()
        return 0
    found = report()

    def text() -> str:
        width = max(len(f.check) for f in found.findings)
        lines = [f"{checks.NAMES[f.severity].upper():8} {f.check:{width}}  {f.detail}" for f in found.findings]
        return "\n".join([*lines, f"=> {checks.NAMES[found.code]}"])

    emit(found.as_dict(), text)
    return found.code


def _each_table(target: Target, emit: Emit, work: Any, field: str, head: str = "") -> list[migrations.TableStatus]:
    """``work(model, store)`` on every table, its results emitted, each table's ``field`` listed under it."""
    results = []
    for index, model in schema_tables(target):
        store = target.store_name(index)
        try:
            results.append(work(model, store))
        except pw.DatabaseError as e:  # a store down: the others go on, and the command exits 1
            model._meta.database.close()
            results.append(migrations.TableStatus(schema.table_key(model), store, None, error=redact(str(e).strip())))
    emit([r.as_dict() for r in results], lambda: _rows(results, field, head))
    return results


def _rows(results: list[migrations.TableStatus], field: str, head: str) -> str:
    lines = [head] if head else []
    for r in results:
        version = "-" if r.version is None else r.version
        state = f"ERROR {r.error}" if r.error else ("current" if r.current else "OUT OF DATE")
        lines.append(f"{r.table}  {r.store}  version {version} of {r.target}  {state}")
        lines += [f"    {item}" for item in getattr(r, field)]
    return "\n".join(lines)


def status(target: Target, emit: Emit) -> int:
    results = _each_table(target, emit, migrations.status, "pending")
    return 0 if all(r.current for r in results) else 1


def migrate(target: Target, emit: Emit, *, dry_run: bool = False,
            lock_timeout: float = migrations.DEFAULT_LOCK_TIMEOUT) -> int:
    if dry_run:
        results = _each_table(target, emit, migrations.status, "pending", "(dry run: nothing changed)")
    else:
        results = _each_table(target, emit, lambda model, store: migrations.migrate(
            model, store, lock_timeout=lock_timeout), "applied")
    return 0 if all(r.error is None for r in results) else 1

