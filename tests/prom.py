"""prometheus_client in multiprocess mode, isolated per test, and scrapes through Dramatiq's own exposition.

prometheus_client picks its multiprocess mode once, when it is imported, from
``PROMETHEUS_MULTIPROC_DIR``.  :func:`isolated` gives a test a directory of its
own: the environment, prometheus_client's value class (a fresh mmap-backed one,
with its own open files) and Dramatiq's ``DB_PATH`` all point there, and the
suite's metrics are off before and after.  :func:`scrape` reads the directory
through Dramatiq's exposition handler, the code behind its port 9191.
"""

from __future__ import annotations

import http.client
import threading
import time
import urllib.request
from http.server import HTTPServer
from pathlib import Path
from typing import Any, Iterator

import pytest

from dramatiq_unique.observe import ENV, disable_metrics


def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The body of a fixture: a multiprocess directory of the test's own."""
    pytest.importorskip("prometheus_client")
    from dramatiq.middleware import prometheus as dramatiq_prometheus
    from prometheus_client import values

    directory = tmp_path / "prometheus"
    directory.mkdir()
    for name in ENV:
        monkeypatch.setenv(name, str(directory))
    monkeypatch.setattr(values, "ValueClass", values.MultiProcessValue())
    monkeypatch.setattr(dramatiq_prometheus, "DB_PATH", str(directory))
    disable_metrics()
    yield directory
    disable_metrics()


class Scrape:
    """One exposition's samples: ``value(name, **labels)`` sums the samples whose labels include ``labels``."""

    def __init__(self, text: str) -> None:
        from prometheus_client.parser import text_string_to_metric_families

        self.text = text
        self.samples = [s for family in text_string_to_metric_families(text) for s in family.samples]

    def value(self, name: str, **labels: Any) -> float:
        return sum(s.value for s in self.samples
                   if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))

    def has(self, name: str, **labels: Any) -> bool:
        return any(s.name == name and all(s.labels.get(k) == v for k, v in labels.items()) for s in self.samples)

    def names(self) -> set[str]:
        return {s.name for s in self.samples}

    def labels(self, name: str, label: str) -> set[str]:
        return {s.labels.get(label) for s in self.samples if s.name == name}


def scrape() -> Scrape:
    """GET /metrics from Dramatiq's exposition handler, served once on a loopback port; a scrape that
    fails is tried again (twice at most), as Prometheus would at its next interval: prometheus_client's
    multiprocess collector fails on a metric file another thread has just created and not yet sized."""
    for _ in range(2):
        try:
            return _scrape_once()
        except (OSError, http.client.HTTPException):
            time.sleep(0.05)
    return _scrape_once()


def _scrape_once() -> Scrape:
    from dramatiq.middleware.prometheus import _metrics_handler

    server = HTTPServer(("127.0.0.1", 0), _metrics_handler)
    server.timeout = 5
    thread = threading.Thread(target=server.handle_request, daemon=True)
    thread.start()
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.server_address[1]}/metrics", timeout=5) as reply:
            text = reply.read().decode()
    finally:
        thread.join(5)
        server.server_close()
    return Scrape(text)
