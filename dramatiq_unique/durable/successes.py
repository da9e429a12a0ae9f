"""The successes of a worker process's jobs, written together: a group commit where each success would make
its own.

A worker thread whose job succeeded writes the outcome before Dramatiq acks the message, and waits for it as
before: the ack still follows the committed outcome.  A thread that finds another thread's successes being
written queues its own; when that statement returns, the first waiting thread writes every success queued
meanwhile in one statement (``finish_succeeded`` in queries.sql) and one commit, and each thread goes on
with its own verdict.  Nobody waits for company: a thread alone writes at once, and successes share a commit
only when they meet one under way, so the batches grow with the load.

Only successes in a PostgreSQL store, outside a transaction, are written this way; a failure or a retry is
written alone, as before.  The statement is :func:`~dramatiq_unique.storage.jobs.finish`'s for each row
(fenced by the attempt's token, its history entry appended), so no promise of an outcome changes.  A batch
that fails (the leader's connection broke) leaves each of its successes to be written on its own thread's
connection, where it meets the outage, or succeeds.
"""

from __future__ import annotations

import dataclasses
import threading
from datetime import datetime
from typing import TYPE_CHECKING, Any, Optional

from dramatiq_unique.storage import jobs
from dramatiq_unique.storage.database import DB_ERRORS, is_postgres
from dramatiq_unique.storage.models import JobStatus

if TYPE_CHECKING:
    from dramatiq_unique.storage.models import JobModel


@dataclasses.dataclass
class _Success:
    model: type["JobModel"]
    job: "JobModel"
    release_hold: bool
    finished_at: datetime
    result: Any
    #: True: written; False: another attempt owns the row; None: not yet, or its batch failed (``failed``).
    written: Optional[bool] = None
    failed: bool = False


class Successes:
    """One worker process's successes, written together where they meet."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._written = threading.Condition(self._lock)
        self._queued: list[_Success] = []
        self._writing = False

    def finish(self, model: type["JobModel"], job: "JobModel", *, release_hold: bool, **fields: Any) -> bool:
        """:func:`~dramatiq_unique.storage.jobs.finish`, with other threads' successes where they meet."""
        db = model._meta.database
        if fields.get("status") != JobStatus.SUCCEEDED.value or not is_postgres(db) or db.in_transaction():
            return jobs.finish(model, job, release_hold=release_hold, **fields)
        success = _Success(model, job, release_hold, fields["finished_at"], fields.get("result"))
        with self._lock:
            self._queued.append(success)
            while self._writing and success.written is None and not success.failed:
                self._written.wait()
            if success.written is None and not success.failed:
                batch, self._queued, self._writing = self._queued, [], True
            else:
                batch = []
        if batch:
            try:
                if len(batch) == 1:  # alone (its own success): written as any other outcome
                    return jobs.finish(model, job, release_hold=release_hold, **fields)
                self._write(batch)
            finally:
                with self._lock:
                    for other in batch:
                        if other.written is None:  # not written: each is written on its own thread
                            other.failed = True
                    self._writing = False
                    self._written.notify_all()
        if success.failed:
            return jobs.finish(model, job, release_hold=release_hold, **fields)
        assert success.written is not None
        return success.written

    @staticmethod
    def _write(batch: list[_Success]) -> None:
        by_model: dict[type["JobModel"], list[_Success]] = {}
        for success in batch:
            by_model.setdefault(success.model, []).append(success)
        for model, successes in by_model.items():
            try:
                written = jobs.finish_succeeded(
                    model, [(s.job, s.release_hold, s.finished_at, s.result) for s in successes])
            except DB_ERRORS:
                for success in successes:
                    success.failed = True
                continue
            for success in successes:
                success.written = success.job.id in written
