"""Small helpers shared by the tests: bounded waits, job rows, queue sizes, queue locks, a skewed clock."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
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


#: ``lost_after`` (ms) of the suites that re-drive tests make: a message counts as lost within a second.
LOST_AFTER = 100


def job_of(message: Any) -> Any:
    """The job row of a sent message (None if it has none)."""
    import dramatiq_unique

    return dramatiq_unique.get_job(message.message_id)


def queue_size(broker: Any, queue_name: str = "default") -> int:
    """Messages waiting in a Redis broker queue and its delay queue."""
    client = broker.client
    ns = broker.namespace
    return int(client.llen(f"{ns}:{queue_name}") + client.llen(f"{ns}:{queue_name}.DQ"))


def queue_lock_of(suite: Any, redis_client: Any, message_id: str) -> Any:
    """The token in the Redis queue lock of the key that job ``message_id`` was sent with (None if none)."""
    import dramatiq_unique

    job = dramatiq_unique.get_job(message_id)
    return redis_client.get(f"redlock:{suite.keys.queue_lock(job.unique_key)}")


def current_token(db: Any, key: str) -> int:
    """The newest fencing token handed out for ``key`` (0 if none)."""
    from dramatiq_unique.storage.models import FenceModel

    return int(FenceModel.select(FenceModel.token).where(FenceModel.key == key).scalar(db) or 0)


def under_faketime(offset: str, code: str, **env: str) -> subprocess.CompletedProcess:
    """``code`` run by a Python whose clock is moved by ``offset`` (libfaketime, e.g. ``"+3s"``): a host whose
    clock has drifted from the database's."""
    faketime = shutil.which("faketime")
    assert faketime, "faketime is needed (Debian's package; .ci/run installs it)"
    argv = [faketime, "-f", offset, sys.executable, "-c", code] if offset else [sys.executable, "-c", code]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, env={**os.environ, **env},
                          cwd=Path(__file__).parents[1])

