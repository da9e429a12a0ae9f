"""Cancelling a job that still waits: :func:`cancel_job`.

A waiting job (``pending``: scheduled, held by the outbox or parked on a lock
or slot; ``queued``; ``retrying``) becomes ``cancelled``, a finished state that
is not the dead set, in one conditional UPDATE by id and revision, so a job that
started meanwhile is not cancelled (:class:`JobStateError`).  The same UPDATE:

* bumps the revision: whatever message of the job is in the broker (queued,
  delayed, a woken one) is skipped when it arrives, as a replaced job's is
  (JobTracking's start matches the message's revision; a skip of ours records
  no failure), and the gate a woken message carries is handed on then;
* frees its unique key (``unique_hold`` NULL), then its Redis queue lock goes,
  if the job's own token still holds it;
* takes a parked row out of its group (``parked_on`` NULL, status no longer
  ``pending``) and ends any deck reservation of it: wakers claim, and decks
  start, only ``pending`` rows of their group, so it is never woken.  The
  group's Redis flag stays: the next waker finds no row and moves on.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Optional, Union

from dramatiq_unique import suite as _config
from dramatiq_unique.context import MARKER
from dramatiq_unique.durable.dead import find, named
from dramatiq_unique.errors import JobStateError
from dramatiq_unique.guard import guarded
from dramatiq_unique.locks import queue
from dramatiq_unique.storage import jobs
from dramatiq_unique.storage.models import WAITING, JobModel, JobStatus, utcnow

if TYPE_CHECKING:
    from dramatiq_unique.suite import Suite

logger = logging.getLogger(__name__)


def cancel_job(
    id_or_message_id: Union[int, str, JobModel], *, model: Optional[type[JobModel]] = None,
    suite: Optional["Suite"] = None,
) -> JobModel:
    """Cancel a waiting job; returns its row, now ``cancelled``.

    The job is named as for :func:`~dramatiq_unique.retry_job`: its message id, its row, or a
    numeric id that only one store has.

    Raises :class:`JobNotFound`, or :class:`JobStateError` for a job that is running or
    finished, or that changed while it was cancelled (it started, was retried, replaced).
    """
    suite = suite or _config.current()
    job = find(suite, id_or_message_id, model)
    if job.status not in WAITING:
        raise JobStateError(f"{named(job)} is {job.status}: only a waiting job can be cancelled", job=job)
    table = type(job)
    fields = {
        table.status: JobStatus.CANCELLED.value,
        table.finished_at: utcnow(),
        table.revision: table.revision + 1,
        table.unique_hold: None,
        table.parked_on: None,
        table.lease_until: None,  # a deck's reservation of a parked row ends with it
        table.missing_since: None,
    }
    cond = (table.id == job.id) & (table.revision == job.revision) & (table.status == job.status)
    with guarded(f"cancelling job {job.message_id}"):
        if not table.update(fields).where(cond).execute():
            now = jobs.get(table, id=job.id)
            state = "gone" if now is None else f"now {now.status}"
            raise JobStateError(f"{named(job)} changed while it was cancelled: {state}", job=now)
        logger.info("Job %s (%s) cancelled while %s.", job.message_id, job.actor_name, job.status)
        # After the row: the hold decided who may send the key; the lock only names the waiting job.
        token = ((job.options or {}).get(MARKER) or {}).get("qt")
        queue.release_key(suite, job.unique_key, token, job.message_id)
        return jobs.get(table, id=job.id) or job
