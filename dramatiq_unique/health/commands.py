"""The ``check``, ``status`` and ``migrate`` commands as functions of a :class:`Target` (registered in
``cli/commands.py``); ``emit(data, text)`` prints ``data`` as JSON with ``--json``, else ``text()``.
``check --probe-port N`` serves the findings as an HTTP probe, 200 while nothing is critical, else 503, with a
short reason naming no host, store, table or job (the full report with ``details``); a recent report is reused."""

from __future__ import annotations

import contextlib
import functools
import http.server
import json
import logging
import threading
import time
from typing import Any, Callable, Optional

import peewee as pw

from dramatiq_unique.health import checks
from dramatiq_unique.health.checks import CRITICAL, NAMES, OK, Report
from dramatiq_unique.health.target import Target, schema_tables
from dramatiq_unique.logs import RedactPasswords
from dramatiq_unique.redaction import redact
from dramatiq_unique.storage import migrations, schema

logger = logging.getLogger(__name__)

Emit = Callable[[Any, Callable[[], str]], None]
#: s a client may take to send its request.
CLIENT_TIMEOUT = 5
#: ms a report is served again before the checks run anew.
DEFAULT_CACHE = 1_000


def check(
    target: Target, emit: Emit, *, overdue_after: float = checks.DEFAULT_OVERDUE_AFTER,
    max_pass_age: Optional[float] = None, probe_port: Optional[int] = None, probe_host: str = "0.0.0.0",
    say: Callable[[str], None] = print, probe_details: bool = False,
) -> int:
    """Print the findings, or with ``probe_port`` serve them over HTTP until interrupted (:class:`ProbeServer`)."""
    report = functools.partial(checks.run, target, overdue_after=overdue_after, max_pass_age=max_pass_age)
    if probe_port is not None:
        server = ProbeServer(report, probe_port, host=probe_host, details=probe_details)
        say(f"health probe on http://{probe_host}:{server.server_address[1]}/"
            + (" (with details: store addresses, job ids)" if probe_details else ""))
        with server, contextlib.suppress(KeyboardInterrupt):
            server.serve_forever()
        return 0
    found = report()

    def text() -> str:
        width = max(len(f.check) for f in found.findings)
        lines = [f"{NAMES[f.severity].upper():8} {f.check:{width}}  {f.detail}" for f in found.findings]
        return "\n".join([*lines, f"=> {NAMES[found.code]}"])

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

    def text() -> str:
        lines = [head] if head else []
        for r in results:
            version = "-" if r.version is None else r.version
            state = f"ERROR {r.error}" if r.error else ("current" if r.current else "OUT OF DATE")
            lines.append(f"{r.table}  {r.store}  version {version} of {r.target}  {state}")
            lines += [f"    {item}" for item in getattr(r, field)]
            lines += [f"    after the upgrade (migrate --contract): {item}" for item in r.contract]
        return "\n".join(lines)

    emit([r.as_dict() for r in results], text)
    return results


def status(target: Target, emit: Emit) -> int:
    results = _each_table(target, emit, migrations.status, "pending")
    return 0 if all(r.current for r in results) else 1


def migrate(target: Target, emit: Emit, *, dry_run: bool = False, contract: bool = False,
            lock_timeout: float = migrations.DEFAULT_LOCK_TIMEOUT) -> int:
    if dry_run:
        results = _each_table(target, emit, lambda model, store: migrations.migrate(
            model, store, dry_run=True, contract=contract), "pending", "(dry run: nothing changed)")
    else:
        results = _each_table(target, emit, lambda model, store: migrations.migrate(
            model, store, contract=contract, lock_timeout=lock_timeout), "applied")
    return 0 if all(r.error is None for r in results) else 1


class ProbeServer(http.server.ThreadingHTTPServer):
    """A probe server bound to ``host:port`` (0: any free port, see ``server_address``), not yet serving."""

    daemon_threads = True

    def __init__(self, run_checks: Callable[[], Report], port: int, *, host: str = "0.0.0.0",
                 cache_ms: float = DEFAULT_CACHE, details: bool = False):
        RedactPasswords.install()  # the check may run without an app, so without setup()
        super().__init__((host, port), _Handler)
        self.run_checks, self.cache_ms, self.details = run_checks, cache_ms, details
        self._lock = threading.Lock()
        self._last: Optional[tuple[float, Report]] = None

    def report(self) -> Report:
        with self._lock:
            if self._last is not None and (time.monotonic() - self._last[0]) * 1000 < self.cache_ms:
                return self._last[1]
            report = self.run_checks()
            self._last = (time.monotonic(), report)
            return report


def short(report: Report) -> dict[str, Any]:
    """What the probe answers without ``details``: the status, and each check's worst severity."""
    worst: dict[str, int] = {}
    for finding in report.findings:
        worst[finding.check] = max(worst.get(finding.check, OK), finding.severity)
    return {"status": NAMES[report.code], "code": report.code, "checks": {k: NAMES[v] for k, v in worst.items()}}


class _Handler(http.server.BaseHTTPRequestHandler):
    server: ProbeServer
    timeout = CLIENT_TIMEOUT

    def version_string(self) -> str:
        return "dramatiq-unique-probe"  # the Server header: no Python version

    def do_GET(self) -> None:  # noqa: N802  (http.server's name)
        try:
            report = self.server.report()
            body = report.as_dict() if self.server.details else short(report)
            code = 503 if report.code >= CRITICAL else 200
        except Exception as e:  # the probe must answer, not hang up
            logger.exception("The health check failed.")
            error = redact(f"{type(e).__name__}: {e}") if self.server.details else type(e).__name__
            body, code = {"status": "critical", "code": CRITICAL, "error": error}, 503
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        logger.debug("probe: " + format, *args)
