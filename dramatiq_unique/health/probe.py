"""``check --probe-port N``: the findings as an HTTP probe, 200 while nothing is critical, else 503, with a
short reason naming no host, store, table or job (the full report with ``details``); a recent report is reused."""

from __future__ import annotations

import http.server
import json
import logging
import threading
import time
from typing import Any, Callable, Optional

from dramatiq_unique.health.checks import CRITICAL, NAMES, OK, Report
from dramatiq_unique.logs import RedactPasswords
from dramatiq_unique.redaction import redact

logger = logging.getLogger(__name__)

#: s a client may take to send its request.
CLIENT_TIMEOUT = 5
#: ms a report is served again before the checks run anew.
DEFAULT_CACHE = 1_000


class ProbeServer(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], run_checks: Callable[[], Report], *, cache_ms: float = DEFAULT_CACHE,
                 details: bool = False):
        super().__init__(address, _Handler)
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


def serve(run_checks: Callable[[], Report], port: int, *, host: str = "0.0.0.0",
          cache_ms: float = DEFAULT_CACHE, details: bool = False) -> ProbeServer:
    """A probe server bound to ``host:port`` (0: any free port, see ``server_address``), not yet serving."""
    RedactPasswords.install()  # the check may run without an app, so without setup()
    return ProbeServer((host, port), run_checks, cache_ms=cache_ms, details=details)
