"""A finished attempt as its job row records it: the status, the error, the result.  JobTracking asks
:func:`outcome` once Dramatiq and its ``Retries`` have decided, and writes it.
"""

from __future__ import annotations

import traceback
from typing import Any, Optional

from dramatiq.middleware.retries import DEFAULT_MIN_BACKOFF

from dramatiq_unique.storage.models import MAX_ERROR_LENGTH, JobStatus, after_ms, dumps, utcnow


def format_error(exception: BaseException) -> str:
    """Type, message and traceback, bounded to ``MAX_ERROR_LENGTH`` (the tail kept)."""
    head = f"{type(exception).__name__}: {exception}"
    text = "".join(traceback.format_exception(type(exception), exception, exception.__traceback__))
    if len(head) + len(text) + 1 > MAX_ERROR_LENGTH:
        text = "...\n" + text[-(MAX_ERROR_LENGTH - len(head) - 5) :]
    return f"{head}\n{text}"[:MAX_ERROR_LENGTH]


def outcome(
    message: Any, result: Any, exception: Optional[BaseException], *, retries: bool, retry_enqueued: bool,
    min_backoff: float = DEFAULT_MIN_BACKOFF,
) -> tuple[dict, bool]:
    """The row's fields for an attempt that ran, and whether the job is done (succeeded or failed for good).
    ``retries``: the broker has Retries; ``retry_enqueued``: Retries sent the message again meanwhile."""
    now = utcnow()
    if exception is None and not message.failed:
        if result is not None:
            try:
                dumps(result)
            except (TypeError, ValueError):
                result = None  # a result JSON cannot hold is not stored
        return dict(status=JobStatus.SUCCEEDED.value, finished_at=now, result=result, last_error=None), True
    if message.failed or not retries:
        error = format_error(exception) if exception else "failed"
        return dict(status=JobStatus.FAILED.value, finished_at=now, last_error=error), True
    assert exception is not None  # not failed, not succeeded: the actor raised
    if retry_enqueued:
        return dict(last_error=format_error(exception)), False
    # Retries could not enqueue the retry (broker down): the row says when it is due, the re-drive sends it.
    return dict(status=JobStatus.RETRYING.value, enqueued_at=None, last_error=format_error(exception),
                process_after=after_ms(min_backoff, now)), False
