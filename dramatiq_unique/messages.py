"""Between a job's row and its messages: what a job keeps of a message, and its message rebuilt.

One place for both directions, because the re-drive, the outbox and the
parking all rebuild messages from rows and must agree on what belongs to
one delivery (and is dropped) and what belongs to the job (and is kept).
"""

from __future__ import annotations

import calendar
from datetime import datetime
from typing import TYPE_CHECKING, Optional

from dramatiq import Message
from dramatiq.common import current_millis

from .context import MARKER

if TYPE_CHECKING:
    from .models import JobModel

#: Message options that belong to one delivery, not to the job.
TRANSIENT_OPTIONS = frozenset({"redis_message_id", "eta", "traceback", "requeue_timestamp"})


def job_options(options: dict, marker: Optional[dict] = None) -> dict:
    """A message's options as a job keeps them: no per-delivery ones; ``marker`` replaces the suite's."""
    kept = {k: v for k, v in options.items() if k not in TRANSIENT_OPTIONS}
    if marker is not None:
        kept[MARKER] = marker
    return kept


def epoch_ms(moment: datetime) -> int:
    """A naive UTC datetime as Dramatiq's millisecond timestamp."""
    return calendar.timegm(moment.utctimetuple()) * 1000 + moment.microsecond // 1000


def rebuild(row: "JobModel", marker: Optional[dict] = None, *, timestamp: Optional[int] = None) -> Message:
    """The job's message from its row: same id, arguments and options, marked as the row's
    current revision, with ``marker``'s entries added.  ``timestamp`` defaults to now."""
    options = job_options(row.options or {})
    options[MARKER] = {**(options.get(MARKER) or {}), "id": row.id, "rev": row.revision, **(marker or {})}
    return Message(
        queue_name=row.queue_name,
        actor_name=row.actor_name,
        args=tuple(row.args or ()),
        kwargs=dict(row.kwargs or {}),
        options=options,
        message_id=row.message_id,
        message_timestamp=current_millis() if timestamp is None else timestamp,
    )
