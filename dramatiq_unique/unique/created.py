"""What the send under way wrote, for its wrapper (:mod:`dramatiq_unique.unique.send`) to undo if
the publish fails, or to keep for the re-drive if the broker is down."""

from __future__ import annotations

import contextvars
import dataclasses
import logging
from typing import TYPE_CHECKING, Any, Callable, Optional

from dramatiq_unique.durable import deferral
from dramatiq_unique.errors import RedisUnavailable
from dramatiq_unique.storage import jobs
from dramatiq_unique.storage.models import JobStatus

if TYPE_CHECKING:
    from dramatiq_unique.suite import Suite

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class Created:
    """What the enqueue under way wrote: a row, or a retry's bookkeeping."""

    #: Undoes it: the publish failed, and it would be a phantom job.
    undo: Callable[[], None]
    #: Keeps it for the re-drive instead: the broker is down (on_broker_down="defer").
    keep: Callable[[], None]


#: What the enqueue under way created, undone or kept if the broker then fails (set by send.py's wrapper).
created_rows: contextvars.ContextVar[Optional[list]] = contextvars.ContextVar("dramatiq_unique_created", default=None)


def created_row(
    model: Any, row_id: int, fields: dict, lock_name: Optional[str], token: Optional[str], suite: "Suite"
) -> None:
    """A row inserted with ``fields``, and the queue lock ``lock_name`` taken under ``token``, if any."""
    created = created_rows.get()
    if created is None or fields["status"] != JobStatus.QUEUED.value:
        return  # a pending row (outbox, deferred) is not published by this send

    def undo() -> None:
        jobs.delete(model, row_id)
        if lock_name and token:
            try:
                suite.locks.release(lock_name, token)
            except RedisUnavailable:  # often the very failure being undone
                logger.warning("Could not free the queue lock %r; it expires by itself.", lock_name)

    # The lock, if it was written, names the waiting job: it stays (the database decides anyway).
    created.append(Created(undo, lambda: deferral.keep(model, row_id, fields["broker_ref"], fields["options"])))


def created_retry(not_enqueued: Callable[[], None]) -> None:
    """A retry of the running job, whose publish failing (broker down or not) calls ``not_enqueued``."""
    created = created_rows.get()
    if created is not None:
        created.append(Created(not_enqueued, not_enqueued))
