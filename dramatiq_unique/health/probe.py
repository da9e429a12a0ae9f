"""``check --probe-port N``: the same findings as an HTTP probe, for orchestrators (Kubernetes, Nomad...).

Any ``GET`` runs the checks and answers with the JSON report: ``200`` while the worst finding is ok or a
warning, ``503`` when one is critical (a warning is for a person to look at, not a reason for an
orchestrator to restart or take a worker out).  Built on the standard library's ``http.server`` alone.
Runs of the checks take turns (a slow probe is not piled up on), and a report younger than
``cache_ms`` is served again; every call the checks make is bounded by the services' timeouts, and a
client is given ``CLIENT_TIMEOUT`` to send its request.
"""

from __future__ import annotations

import http.server
import json
import logging
import threading
import time
from typing import Any, Callable, Optional

from dramatiq_unique.health.checks import CRITICAL, Report

logger = logging.getLogger(__name__)

#: s a client may take to send its request.
CLIENT_TIMEOUT = 5
#: ms a report is served again before the checks run anew.
DEFAULT_CACHE = 1_000


class ProbeServer(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], run_checks: Callable[[], Report], *, cache_ms: float = DEFAULT_CACHE):
        super().__init__(address, _Handler)
        self.run_checks = run_checks
        self.cache_ms = cache_ms
        self._lock = threading.Lock()
        self._last: Optional[tuple[float, Report]] = None

    def report(self) -> Report:
        with self._lock:
            if self._last is not None and (time.monotonic() - self._last[0]) * 1000 < self.cache_ms:
                return self._last[1]
            report = self.run_checks()
            self._last = (time.monotonic(), report)
            return report


class _Handler(http.server.BaseHTTPRequestHandler):
    server: ProbeServer
    timeout = CLIENT_TIMEOUT

    def do_GET(self) -> None:  # noqa: N802  (http.server's name)
        try:
            report = self.server.report()
            body, code = report.as_dict(), (503 if report.code >= CRITICAL else 200)
        except Exception as e:  # the probe must answer, not hang up
            logger.exception("The health check failed.")
            body, code = {"status": "critical", "code": CRITICAL, "error": f"{type(e).__name__}: {e}"}, 503
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
          cache_ms: float = DEFAULT_CACHE) -> ProbeServer:
    """A probe server bound to ``host:port`` (0: any free port, see ``server_address``), not yet serving:
    call ``serve_forever()`` (and ``shutdown()`` from another thread)."""
    return ProbeServer((host, port), run_checks, cache_ms=cache_ms)
