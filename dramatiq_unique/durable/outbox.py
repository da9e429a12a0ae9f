"""The transactional outbox: sends that commit, or roll back, with the caller's own writes.

Inside ``transaction()`` (:func:`dramatiq_unique.unique.send.transaction`),
a send of a tracked actor writes its job row as ``pending`` in the
caller's database transaction (the suite's peewee Database; peewee
connections and transactions are per thread) and publishes nothing.
After the commit, each job is claimed (``pending`` -> ``queued``,
conditionally, so a re-drive pass that got there first wins and nothing
is sent twice) and published: on the suite's Redis broker, the due ones
in batches, a claim and a publish per batch
(:mod:`dramatiq_unique.durable.outbox_batch`).  If the broker is down
then, the rows go back to ``pending`` and the re-drive sends them later;
the caller sees no error, because its transaction did commit.

The held sends follow the caller's transaction exactly
(:mod:`dramatiq_unique.storage.savepoints`): a savepoint that rolls back
(a nested ``atomic()`` or ``transaction()``, ``sp.rollback()``) drops
what was sent inside it, as the database drops its rows; the
transaction's rollback (``txn.rollback()``, an exception) drops all it
held; a ``txn.commit()`` inside the block publishes what it committed.
A rollback leaves no row and publishes nothing.  Sends of untracked
actors inside the block are held in memory and published after the
commit too; having no row, they cannot be re-driven if the broker is
down at that moment (set ``track=True`` for that).

A tracked send's claim also checks that the row is still as that send
wrote it, so a held send that outlived its rollback (a savepoint made
past peewee, on the driver's cursor) finds nothing to claim: a duplicate
that replaces a waiting job's arguments (``unique_on_conflict="replace"``)
sets the row ``pending`` and stamps it with the id of its held send
(:meth:`Block.stamp`), and only the send that stamped it last publishes
it.  A rolled-back replace and a committed one may give the row the same
revision; never the same stamp.

Unique sends inside the block rely on the database's unique index alone:
a Redis queue lock taken for a send that is then rolled back would name
a job that does not exist.
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
from dramatiq_unique.broker.refs import broker_ref, resending
from dramatiq_unique.durable import deferral, outbox_batch
from dramatiq_unique.durable.messages import job_options
from dramatiq_unique.errors import DramatiqUniqueError
from dramatiq_unique.storage import jobs, savepoints
from dramatiq_unique.storage.models import JobStatus, utcnow

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
    #: time.monotonic() at which the delay runs out.
    due: float
    #: (model, row id, revision) of the job row the send wrote in the transaction.
    row: Optional[tuple[type["JobModel"], int, int]]
    #: What a replace wrote into its row's ``broker_ref`` (see the module docstring); None for an insert.
    stamp: Optional[str] = None


class Block:
    """A ``transaction()`` block open in this thread: its sends are held in the database transaction."""

    def __init__(self, suite: "Suite") -> None:
        self.suite = suite
        self.open = True

    def defer(
        self, broker: "Broker", message: "Message", delay: Optional[int], row: Optional[tuple] = None, *,
        stamp: Optional[str] = None,
    ) -> Deferred:
        """Hold ``message`` until commit; returns the exception that stops the broker's enqueue."""
        clean = dataclasses.replace(
            message, queue_name=q_name(message.queue_name), options=job_options(message.options)
        )
        due = time.monotonic() + (delay or 0) / 1000
        savepoints.hold(self.suite.db, publish_held, _Item(self.suite, broker, clean, delay, due, row, stamp))
        return Deferred(clean)

    def stamp(self, model: type["JobModel"]) -> tuple[str, dict[str, Any]]:
        """A replace of a waiting job in this block: the id of the send it will hold, and what the replace
        writes besides the new arguments: the row waits ``pending``, out of the broker, with that id in its
        ``broker_ref`` (which the send's claim checks); a parked row stays parked (it is woken from the row)."""
        stamp = uuid.uuid4().hex
        writes = {"enqueued_at": None, "broker_ref": stamp, "checked_at": None, "missing_since": None}
        held: dict[str, Any] = {name: pw.Case(None, [(model.parked_on.is_null(), value)], getattr(model, name))
                                for name, value in writes.items()}
        held["status"] = JobStatus.PENDING.value  # a parked row is pending already
        return stamp, held


def publish_held(items: list[_Item]) -> None:
    """After commit: the held sends that the commit kept, claimed and published, each suite's by its
    :class:`Outbox`.  Not inside a block: a ``txn.commit()`` within one publishes from inside it."""
    token = _active.set(_PUBLISHING)
    try:
        suites: dict[int, Outbox] = {}
        for item in items:
            outbox = suites.get(id(item.suite))
            if outbox is None:
                outbox = suites[id(item.suite)] = Outbox(item.suite)
            outbox.items.append(item)
        for outbox in suites.values():
            outbox.publish()
    finally:
        _active.reset(token)


class Outbox:
    """The sends of one suite that one commit kept."""

    def __init__(self, suite: "Suite") -> None:
        self.suite = suite
        self.items: list[_Item] = []

    def publish(self) -> None:
        """After commit: claim and publish every held send.  Never raises (the commit happened)."""
        down = False
        rest = self.items
        if self.suite.publisher is not None and self.suite.publisher.batches():
            rest, down = self._publish_batches()
        for item in rest:
            if down:
                if item.row is None:
                    logger.error("Could not publish untracked message %s after commit: the broker failed; it is "
                                 "lost (track=True would keep it for the re-drive).", item.message.message_id)
                continue  # its row stays pending for the re-drive
            try:
                if item.row is not None and not self._claim(item):
                    continue  # a re-drive pass sent it already, or a later send wrote the row
                # What is left of the delay; none once due (straight to the queue).
                left = int((item.due - time.monotonic()) * 1000) if item.delay is not None else 0
                delay = left if left > 0 else None
                with resending():
                    sent = item.broker.enqueue(item.message, delay=delay)
                if item.row is not None:
                    model, row_id, _ = item.row
                    model.update(broker_ref=broker_ref(sent)).where(
                        (model.id == row_id) & model.broker_ref.is_null()
                    ).execute()
            except Exception as error:
                down = True
                if item.row is not None:
                    # After commit: pending for the re-drive, logged as the suite logs a broker outage.
                    deferral.send_failed(self.suite, item.broker, item.message.message_id, error)
                    self._unclaim(item)
                else:
                    logger.error(
                        "Could not publish untracked message %s after commit; it is lost (track=True "
                        "would keep it for the re-drive).", item.message.message_id, exc_info=True,
                    )
        self.items = []

    def _publish_batches(self) -> tuple[list[_Item], bool]:
        """The due tracked sends on the suite's broker, in batches (durable/outbox_batch.py); returns the
        sends left to publish one by one, and whether the broker failed (the rest then waits too)."""
        broker = self.suite.broker
        assert broker is not None  # it has a publisher
        rest: list[_Item] = []
        groups: dict[Any, list[_Item]] = {}
        now = time.monotonic()
        for item in self.items:
            if item.row is not None and item.broker is broker and (item.delay is None or item.due <= now):
                groups.setdefault(item.row[0], []).append(item)  # by store
            else:
                rest.append(item)
        size = self.suite.settings.send_many_batch
        for model, items in groups.items():
            for start in range(0, len(items), size):
                chunk = items[start:start + size]
                try:
                    sent = outbox_batch.claim_and_publish(
                        self.suite, model,
                        [(item.row[1], item.row[2], item.stamp, item.message) for item in chunk],  # type: ignore[index]
                    )
                except Exception as error:
                    # After commit: pending for the re-drive (the claims were undone), logged as the suite
                    # logs a broker outage; once for the batch.
                    first = chunk[0].message.message_id
                    deferral.send_failed(self.suite, broker, f"{first} (and {len(chunk) - 1} more)", error)
                    return rest, True
                deferral.published(broker)
                for message in sent:
                    broker.emit_after("enqueue", message, None)
        return rest, False

    def _claim(self, item: _Item) -> bool:
        """``pending`` -> ``queued``, if the row is still as this send left it (see the claim_held query)."""
        model, row_id, revision = item.row  # type: ignore[misc]
        cond = (
            (model.id == row_id)
            # SQLite may reuse the id of a rolled-back row: the message id tells them apart.
            & (model.message_id == item.message.message_id)
            & (model.status == JobStatus.PENDING.value)
            & (model.revision == revision)
            & model.parked_on.is_null()
        )
        if item.stamp is not None:
            cond &= model.broker_ref == item.stamp  # the send that last wrote the row is this one
        # The stamp goes with the claim: the broker's id is written after the publish.
        return bool(model.update(status=JobStatus.QUEUED.value, enqueued_at=utcnow(), broker_ref=None).where(cond)
                    .execute())

    def _unclaim(self, item: _Item) -> None:
        model, row_id, _ = item.row  # type: ignore[misc]
        try:
            jobs.unclaim_sends(model, [row_id], JobStatus.PENDING.value)
        except Exception:
            # Left queued without a broker_ref: the lost-message check recovers it.
            logger.exception("Could not put job %s back to pending.", item.message.message_id)


_active: contextvars.ContextVar[Optional[Block]] = contextvars.ContextVar("dramatiq_unique_outbox", default=None)
#: Set while held sends are published: they are in no block, even inside a framework's open transaction.
_PUBLISHING = Block.__new__(Block)
_PUBLISHING.open = False


def active() -> Optional[Block]:
    """The ``transaction()`` block this thread is in, if any (a context copied to another thread is
    not in it: the transaction is the opening thread's, as peewee's transactions are per thread)."""
    block = _active.get()
    if block is None:  # a framework's transaction (dramatiq_unique.contrib) holds the sends as a block does
        suite = _config._current
        block = suite.framework_block if suite is not None else None
    return block if block is not None and block.open and block.suite.db.in_transaction() else None


@contextlib.contextmanager
def opened(suite: "Suite") -> Iterator[Any]:
    """A database transaction of ``suite`` whose sends are held until it commits.

    The public face is :func:`dramatiq_unique.unique.send.transaction`, which first puts the
    broker's enqueue in place (the enqueue side hands its sends to the block, not the
    other way round).  Yields peewee's transaction object: a savepoint when the thread is in a
    transaction already (a block nested in another, or in the caller's own ``atomic()``).  The
    sends are held in that transaction (:mod:`dramatiq_unique.storage.savepoints`): whatever rolls
    back drops the ones it covers, and the outermost commit publishes the rest.
    """
    block = Block(suite)
    token = _active.set(block)
    try:
        with suite.db.atomic() as txn:
            yield txn
    finally:
        block.open = False
        _active.reset(token)
