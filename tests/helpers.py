"""Small helpers shared by the tests: bounded waits, job rows, queue sizes, queue locks."""

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


def when_recorded(message: Any, record: Callable[[], Any]) -> None:
    """Call ``record`` once ``message``'s outcome is recorded: at once, from an ``after_process_message``
    hook that runs after the suite's, or, for a success the worker process's outcome writer writes
    later, once its batch is written (or given up on) and its message acked."""
    from dramatiq_unique.durable import outcome_writer

    if getattr(message, outcome_writer._OUTCOME, None) is None:
        record()
        return
    setattr(message, _WHEN_RECORDED, record)
    writer = outcome_writer.OutcomeWriter
    if getattr(writer._ack, "_when_recorded", False):
        return
    ack = writer._ack

    def acked(self: Any, batch: list) -> None:
        ack(self, batch)
        for _, written in batch:
            getattr(written, _WHEN_RECORDED, lambda: None)()

    acked._when_recorded = True  # type: ignore[attr-defined]
    writer._ack = acked  # type: ignore[method-assign]


_WHEN_RECORDED = "_test_when_recorded"
