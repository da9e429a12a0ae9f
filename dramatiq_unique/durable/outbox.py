"""The transactional outbox: sends that commit, or roll back, with the caller's own writes.

Inside ``transaction()`` a tracked send writes its row ``pending`` and publishes nothing; after the commit
each row is claimed (only while still as its send left it) and published; a broker down leaves them
``pending`` for the re-drive.  See docs/howto/outbox.md.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import logging
import time
import uuid
from typing import TYPE_CHECKING, Any, Iterator, Optional

import peewee as pw
from dramatiq.common import q_name

from dramatiq_unique import suite as _config
from dramatiq_unique.broker.refs import REDIS_MESSAGE_ID, broker_ref, resending
from dramatiq_unique.durable import deferral
from dramatiq_unique.durable.messages import job_options
from dramatiq_unique.errors import DramatiqUniqueError
from dramatiq_unique.storage import jobs, queries, savepoints
from dramatiq_unique.storage.database import is_postgres
from dramatiq_unique.storage.models import JobStatus, dumps, utcnow

if TYPE_CHECKING:
    from dramatiq import Broker, Message

    from dramatiq_unique.storage.models import JobModel
    from dramatiq_unique.suite import Suite

logger = logging.getLogger(__name__)


class Deferred(DramatiqUniqueError):
    """Internal: the send is held until the transaction commits"""

    def __init__(self, message: "Message") -> None:
        super().__init__(message.message_id)
        self.message = message


@dataclasses.dataclass
class _Item:
    suite: "Suite"
    broker: "Broker"
    message: "Message"
    delay: Optional[int]
    due: float  # time.monotonic() at which the delay runs out
    row: Optional[tuple[type["JobModel"], int, int]]  # (model, id, revision) of the row the send wrote
    stamp: Optional[str] = None  # what a replace wrote into its row's broker_ref (Block.stamp)


@dataclasses.dataclass(eq=False)
class Block:
    """A ``transaction()`` block open in this thread: its sends are held in the database transaction."""

    suite: "Suite"
    open: bool = True

    def defer(
        self, broker: "Broker", message: "Message", delay: Optional[int], row: Optional[tuple] = None, *,
        stamp: Optional[str] = None,
    ) -> Deferred:
        """Hold ``message`` until commit; returns the exception that stops the broker's enqueue."""
        queue_name, options = q_name(message.queue_name), job_options(message.options)
        clean = dataclasses.replace(message, queue_name=queue_name, options=options)
        due = time.monotonic() + (delay or 0) / 1000
        savepoints.hold(self.suite.db, publish_held, _Item(self.suite, broker, clean, delay, due, row, stamp))
        return Deferred(clean)

    def stamp(self, model: type["JobModel"]) -> tuple[str, dict[str, Any]]:
        """A replace of a waiting job in this block: the id of the send it will hold, and what it writes besides
        the arguments: the row waits ``pending`` with that id in its ``broker_ref`` (the send's claim checks
        it); a parked row stays parked (it is woken from the row)."""
        stamp = uuid.uuid4().hex
        writes = {"enqueued_at": None, "broker_ref": stamp, "checked_at": None, "missing_since": None}
        held: dict[str, Any] = {name: pw.Case(None, [(model.parked_on.is_null(), value)], getattr(model, name))
                                for name, value in writes.items()}
        held["status"] = JobStatus.PENDING.value  # a parked row is pending already
        return stamp, held


def publish_held(items: list[_Item]) -> None:
    """After commit: the held sends that the commit kept, claimed and published, each suite's by
    :func:`publish`.  Not inside a block: a ``txn.commit()`` within one publishes from inside it."""
    token = _active.set(_PUBLISHING)
    try:
        suites: dict[int, list[_Item]] = {}
        for item in items:
            suites.setdefault(id(item.suite), []).append(item)
        for held in suites.values():
            publish(held[0].suite, held)
    finally:
        _active.reset(token)


def publish(suite: "Suite", items: list[_Item]) -> None:
    """After commit: claim and publish every held send of ``suite``.  Never raises (the commit happened)."""
    down, rest = False, items
    if suite.publisher is not None and suite.publisher.batches():
        rest, down = _publish_batches(suite, items)
    for item in rest:
        if down:
            if item.row is None:
                logger.error("Could not publish untracked message %s after commit: the broker failed; it is "
                             "lost (track=True would keep it for the re-drive).", item.message.message_id)
            continue  # its row stays pending for the re-drive
        try:
            # pending -> queued while the row is as this send left it; its broker id is written after the
            # publish.  Not claimed: a re-drive pass sent it already, or a later send wrote the row.
            if item.row is not None and not _claim_held(item.row[0], [(*item.row[1:], item.stamp, item.message)],
                                                        [None]):
                continue
            # What is left of the delay; none once due (straight to the queue).
            left = int((item.due - time.monotonic()) * 1000) if item.delay is not None else 0
            with resending():
                sent = item.broker.enqueue(item.message, delay=left if left > 0 else None)
            if item.row is not None:
                jobs.record_refs(item.row[0], {item.row[1]: broker_ref(sent)})  # a ref set meanwhile is kept
        except Exception as error:
            down = True
            if item.row is not None:
                # Pending for the re-drive, logged as the suite logs a broker outage.
                deferral.send_failed(suite, item.broker, item.message.message_id, error)
                try:
                    jobs.unclaim_sends(item.row[0], [item.row[1]], JobStatus.PENDING.value)
                except Exception:  # left queued without a broker_ref: the lost-message check recovers it
                    logger.exception("Could not put job %s back to pending.", item.message.message_id)
            else:
                logger.error("Could not publish untracked message %s after commit; it is lost (track=True "
                             "would keep it for the re-drive).", item.message.message_id, exc_info=True)


def _publish_batches(suite: "Suite", items: list[_Item]) -> tuple[list[_Item], bool]:
    """The due tracked sends on the suite's broker, in batches; returns the sends left to publish one
    by one, and whether the broker failed (the rest then waits too)."""
    broker = suite.broker
    assert broker is not None  # it has a publisher
    rest: list[_Item] = []
    groups: dict[Any, list[_Item]] = {}
    now = time.monotonic()
    for item in items:
        if item.row is not None and item.broker is broker and (item.delay is None or item.due <= now):
            groups.setdefault(item.row[0], []).append(item)  # by store
        else:
            rest.append(item)
    for model, held in groups.items():
        for chunk in pw.chunked(held, suite.settings.send_many_batch):
            try:
                rows = [(item.row[1], item.row[2], item.stamp, item.message) for item in chunk]  # type: ignore[index]
                sent = claim_and_publish(suite, model, rows)
            except Exception as error:
                # Pending for the re-drive (the claims were undone), logged once for the batch.
                first = chunk[0].message.message_id
                deferral.send_failed(suite, broker, f"{first} (and {len(chunk) - 1} more)", error)
                return rest, True
            deferral.published(broker)
            for message in sent:
                broker.emit_after("enqueue", message, None)
    return rest, False


#: A held send: (its row's id, the row's revision at the send, the stamp a replace wrote into the row's
#: ``broker_ref`` or None, its message as held).
Held = tuple[int, int, Optional[str], "Message"]


def claim_and_publish(suite: "Suite", model: type["JobModel"], held: list[Held]) -> list["Message"]:
    """Claim ``held``'s rows, each with its broker id, and publish the ones claimed in one MULTI/EXEC;
    returns them.  If the publish fails, the claimed rows go back to ``pending`` and the error is raised."""
    publisher = suite.publisher
    assert publisher is not None  # batches only where there is one
    # Each held send its own broker id, which the claim returns: a row is claimed by at most one of
    # them (the one it is still as that send left it), not always the last one held for it.
    sent = [message.copy(options={REDIS_MESSAGE_ID: str(uuid.uuid4())}) for _, _, _, message in held]
    claimed = _claim_held(model, held, [m.options[REDIS_MESSAGE_ID] for m in sent])
    messages = [m for m in sent if m.options[REDIS_MESSAGE_ID] in claimed]
    if not messages:
        return []
    try:
        publisher.publish_many([(m.queue_name, m.options[REDIS_MESSAGE_ID], m.encode(), None) for m in messages])
    except BaseException:
        try:
            jobs.unclaim_sends(model, sorted(set(claimed.values())), JobStatus.PENDING.value,
                               ref=[m.options[REDIS_MESSAGE_ID] for m in messages])
        except Exception:
            # Left queued with a broker id the broker never had: the lost-message check sends them again.
            logger.exception("Could not put %d jobs back to pending after their publish failed.", len(claimed))
        raise
    return messages


def _claim_held(model: type["JobModel"], held: list[Held], refs: list[Optional[str]]) -> dict[Optional[str], int]:
    """``pending`` -> ``queued`` with each row's broker id (``refs``), for the rows still as the send left them
    (the ``claim_held`` query); {broker id: row id} of the sends that claimed one."""
    db = model._meta.database
    values: dict[str, Any] = {"queued": JobStatus.QUEUED.value, "pending": JobStatus.PENDING.value,
                              "now": model.enqueued_at.db_value(utcnow())}
    if is_postgres(db):
        values.update(ids=[row_id for row_id, _, _, _ in held], message_ids=[m.message_id for _, _, _, m in held],
                      revisions=[revision for _, revision, _, _ in held], stamps=[stamp for _, _, stamp, _ in held],
                      refs=refs)
    else:
        values["held"] = dumps([[row_id, message.message_id, revision, stamp, ref]
                                for (row_id, revision, stamp, message), ref in zip(held, refs, strict=True)])
    cursor = queries.run(model, "claim_held", values, prepare=False)  # see the query's comment
    return {ref: row_id for (row_id, ref) in cursor.fetchall()}


_active: contextvars.ContextVar[Optional[Block]] = contextvars.ContextVar("dramatiq_unique_outbox", default=None)
#: Set while held sends are published: they are in no block, even inside a framework's open transaction.
_PUBLISHING = Block(None, open=False)  # type: ignore[arg-type]


def active() -> Optional[Block]:
    """The ``transaction()`` block this thread is in (not a context copied to another thread: peewee's
    transactions are per thread)."""
    block = _active.get()
    if block is None:  # a framework's transaction (dramatiq_unique.contrib) holds the sends as a block does
        suite = _config._current
        block = suite.framework_block if suite is not None else None
    return block if block is not None and block.open and block.suite.db.in_transaction() else None


@contextlib.contextmanager
def opened(suite: "Suite") -> Iterator[Any]:
    """:func:`dramatiq_unique.transaction`: a database transaction (a savepoint inside another) whose sends
    are held until it commits; yields peewee's transaction object."""
    block = Block(suite)
    token = _active.set(block)
    try:
        with suite.db.atomic() as txn:
            yield txn
    finally:
        block.open = False
        _active.reset(token)
