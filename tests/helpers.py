"""Small helpers shared by the tests: bounded waits, queue sizes."""

from __future__ import annotations

import time
from typing import Any, Callable


def wait_until(predicate: Callable[[], Any], *, timeout: float = 10.0, interval: float = 0.02, what: str = "") -> Any:
    """Poll ``predicate`` until it is truthy; fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}")
        time.sleep(interval)


def queue_size(broker: Any, queue_name: str = "default") -> int:
    """Messages waiting in a Redis broker queue and its delay queue."""
    client = broker.client
    ns = broker.namespace
    return int(client.llen(f"{ns}:{queue_name}") + client.llen(f"{ns}:{queue_name}.DQ"))
