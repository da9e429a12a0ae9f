"""The starts of the tracked jobs a worker has fetched, written together: one statement and one commit where
each job's start would make its own.

Dramatiq's Redis consumer moves up to its prefetch of messages into the worker at once, and hands them to the
worker's queue one by one (broker/consumer.py tells of each).  The first worker thread to take up one of the
jobs received since the last such start starts them all in one statement
(``start_fetched`` in queries.sql); their threads find their row started and run under it.  Each row is then
``running`` from that start, while its message may still wait in the worker's queue behind other jobs, as
Oban's and Solid Queue's fetches make their jobs executing or claimed: its lease counts from then.  A thread
that takes up its job after half that lease renews it first (``renew_fetched``).  A started row whose message
no thread took up goes back to ``queued``, its attempt not counted (``unstart_fetched``): when the worker
stops and hands its messages back, and when a middleware refuses the message before the suite's start.  A
worker that dies leaves them ``running`` until their lease runs out, as it leaves its running jobs.

Only jobs that take no execution lock and no concurrency slot, in a PostgreSQL store, are started this way:
the gates decide each of theirs when its thread takes it up.  A unique job whose start frees its key
(``until_executing``) frees it in the shared start; its thread frees the key's Redis queue lock as it takes
the job up, as after its own start.  Every promise of a start holds: the statement is
:func:`~dramatiq_unique.storage.jobs.start`'s for each row (the revision, not finished, no other attempt
under a live lease; the next token), and a second copy of a waiting job is left to its own start, which
refuses it as a copy of a running job.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from typing import TYPE_CHECKING, Any, Optional

from dramatiq_unique import context
from dramatiq_unique.context import MARKER
from dramatiq_unique.storage import jobs
from dramatiq_unique.storage.database import DB_ERRORS, is_postgres

if TYPE_CHECKING:
    from dramatiq_unique.storage.models import JobModel
    from dramatiq_unique.suite import Suite

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class _Fetch:
    """Fetched jobs that are started together."""

    #: The jobs not yet taken up, by message id: (their store's model, row id, revision, lease ms, whether their
    #: start frees their key).
    jobs: dict[str, tuple[type["JobModel"], int, int, float, bool]]
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)
    #: Once started: the rows the statement started, by message id, until each is taken up.
    rows: Optional[dict[str, "JobModel"]] = None
    #: time.monotonic() when the statement was asked for.
    asked: float = 0.0


class Fetches:
    """The jobs one worker process received, started together (a listener of broker/consumer.py)."""

    def __init__(self, suite: "Suite") -> None:
        self.suite = suite
        self._lock = threading.Lock()
        self._by_message: dict[str, _Fetch] = {}
        #: The jobs fetched since the last start, which the next one starts.
        self._open = _Fetch({})
        self._open_ids: set[int] = set()

    @property
    def worker(self) -> str:
        """The ``worker`` of the rows a fetch started, until their threads take them up."""
        return f"{self.suite.worker_id}:fetched"

    def received(self, message: Any) -> None:
        job = self._startable(message)
        if job is None:
            return
        with self._lock:
            # A copy of a job already waiting (one message delivered twice) is left to its own start,
            # which refuses it while the other copy's attempt runs.
            if job[1] not in self._open_ids and message.message_id not in self._by_message:
                self._open_ids.add(job[1])
                self._open.jobs[message.message_id] = job
                self._by_message[message.message_id] = self._open

    def _startable(self, message: Any) -> Optional[tuple[type["JobModel"], int, int, float, bool]]:
        marker = message.options.get(MARKER)
        config = self.suite.actor_config(message.actor_name)
        if not marker or "id" not in marker or config is None or message.options.get("eta") is not None:
            return None
        config = config.for_message(message.options)
        if config.execution_lock or config.has_slots:
            return None
        model = context.job_model(self.suite, config.model, message.options)
        if not is_postgres(model._meta.database):
            return None
        return model, marker["id"], marker.get("rev", 0), config.unique_ttl, config.released_at_start

    def take(self, message: Any) -> Optional[tuple["JobModel", float]]:
        """The row of ``message``'s job, started by its fetch (the first thread to take up one of its jobs starts
        them all), and when that start was asked for (monotonic); None: the job starts on its own."""
        with self._lock:
            fetch = self._by_message.pop(message.message_id, None)
            if fetch is None:
                return None
            if fetch is self._open:
                self._open, self._open_ids = _Fetch({}), set()
        with fetch.lock:
            if fetch.rows is None:
                self._start(fetch)
            assert fetch.rows is not None
            job = fetch.rows.pop(message.message_id, None)
            entry = fetch.jobs.pop(message.message_id, None)
        if job is None or entry is None:
            return None
        lease_ms = entry[3]  # as the start wrote it
        asked = fetch.asked
        if (time.monotonic() - asked) * 1000 > lease_ms / 2:
            asked = time.monotonic()
            try:
                if not jobs.renew_fetched(type(job), job, lease_ms):
                    return None  # no longer this start's: the job's own start says why
            except DB_ERRORS:
                return None
        return job, asked

    def _start(self, fetch: _Fetch) -> None:
        fetch.rows, fetch.asked = {}, time.monotonic()
        if len(fetch.jobs) < 2:
            return  # alone, a job starts as any other
        by_model: dict[type["JobModel"], dict[int, str]] = {}
        for message_id, (model, job_id, *_) in fetch.jobs.items():
            by_model.setdefault(model, {})[job_id] = message_id
        for model, messages in by_model.items():
            rows = [fetch.jobs[message_id][1:] for message_id in messages.values()]
            try:
                started = jobs.start_fetched(model, rows, self.worker)
            except DB_ERRORS:
                # Each job then starts on its own, and meets the outage there.  A start that committed
                # but whose answer was lost leaves its rows running under their lease, as a lost single
                # start does.
                logger.debug("Could not start %d fetched jobs together.", len(rows), exc_info=True)
                continue
            for job_id, job in started.items():
                fetch.rows[messages[job_id]] = job

    def release(self, messages: list[Any]) -> None:
        """Put the rows their fetch started for ``messages``, which no thread took up, back to ``queued``."""
        untaken: dict[type["JobModel"], tuple[list["JobModel"], list[int]]] = {}
        with self._lock:
            fetches = [(message.message_id, self._by_message.pop(message.message_id, None)) for message in messages]
        for message_id, fetch in fetches:
            if fetch is None:
                continue
            with fetch.lock:
                entry = fetch.jobs.pop(message_id, None)
                job = fetch.rows.pop(message_id, None) if fetch.rows is not None else None
            if job is not None and entry is not None:
                started, held = untaken.setdefault(type(job), ([], []))
                started.append(job)
                if entry[4]:  # its start freed its key
                    held.append(job.id)
        for model, (started, held) in untaken.items():
            try:
                jobs.unstart_fetched(model, started, held)
            except DB_ERRORS:
                logger.warning("Could not put %d jobs started with their fetch back to queued; they wait for their "
                               "lease to run out.", len(started), exc_info=True)

    requeued = release
