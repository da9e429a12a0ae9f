"""Sending many jobs at once: :func:`send_many`, batch by batch (:class:`Batch`: one multi-row INSERT, one
publish round trip); what the bulk path does not do goes through the single send (docs/howto/send-many.md)."""

from __future__ import annotations

import collections
import dataclasses
import threading
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Iterable, Optional

from dramatiq.common import current_millis, dq_name

from dramatiq_unique import options as opt
from dramatiq_unique import suite as _config
from dramatiq_unique.broker.refs import REDIS_MESSAGE_ID
from dramatiq_unique.context import MARKER
from dramatiq_unique.durable import deferral, outbox
from dramatiq_unique.durable.messages import job_options
from dramatiq_unique.errors import DatabaseUnavailable, InvalidOption
from dramatiq_unique.guard import guarded
from dramatiq_unique.observe import events
from dramatiq_unique.storage import jobs
from dramatiq_unique.unique import recent
from dramatiq_unique.unique.enqueue import Created, made_row, new_row, publish_failed, queue_lock_ttl, store, undo_all
from dramatiq_unique.unique.send import check_options

if TYPE_CHECKING:
    from dramatiq import Actor, Message

    from dramatiq_unique.suite import ActorConfig, Suite

Item = tuple[tuple, dict]


def items_of(items: Iterable[Any]) -> list[Item]:
    """Each item (an args tuple or list, a kwargs dict, an ``(args, kwargs)`` pair) as ``(args, kwargs)``."""
    if isinstance(items, (str, bytes, dict)):
        raise InvalidOption(f"send_many takes a list of items, not {type(items).__name__}")
    out: list[Item] = []
    for index, item in enumerate(items):
        if isinstance(item, dict):
            out.append(((), item))
        elif (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], (tuple, list))
              and isinstance(item[1], dict)):
            out.append((tuple(item[0]), item[1]))
        elif isinstance(item, (tuple, list)):
            out.append((tuple(item), {}))
        else:
            raise InvalidOption(f"send_many item {index} must be an args tuple, a kwargs dict or an "
                                f"(args, kwargs) pair, not {type(item).__name__}")
        if not all(isinstance(name, str) for name in out[-1][1]):
            raise InvalidOption(f"send_many item {index} has a keyword that is not a string")
    return out


def batches(items: list[Item], size: int) -> list[list[Item]]:
    size = max(1, int(size))
    return [items[start:start + size] for start in range(0, len(items), size)]


def send_many(actor: "Actor", items: Iterable[Any], *, delay: Optional[int] = None) -> list["Message"]:
    """Send one job per item; returns one message per item, in order, each as ``send()`` would return
    it (a duplicate's message is the existing job's).  How each option behaves in bulk:
    docs/howto/send-many.md."""
    parsed = items_of(items)
    opt.check_delay(delay)
    suite = _config._current
    config = suite.actor_config(actor.actor_name) if suite is not None else None
    # The bulk path: batches published around the suite's own broker's enqueue; "raise" on a duplicate: one by one.
    if suite is None or config is None or actor.broker is not suite.broker or suite.publisher is None \
            or not suite.publisher.batches() or (config.unique and config.unique_on_conflict == "raise"):
        return [_single(actor, item, delay) for item in parsed]
    work = batches(parsed, suite.settings.send_many_batch)
    # In transaction(), or in a transaction of the caller's own: the INSERT goes through the caller's
    # connection, in this thread (a helper's connection would wait on the caller's locks).
    if len(work) == 1 or outbox.active() is not None or any(db.in_transaction() for db in suite.stores.databases):
        sent: list[Message] = []
        for items in work:
            batch = Batch(suite, config, actor, delay, items)
            batch.store()
            batch.publish()
            sent += batch.settle()
        return sent
    return _pipelined(suite, config, actor, delay, work)


def _pipelined(suite: "Suite", config: "ActorConfig", actor: "Actor", delay: Optional[int],
               work: list[list[Item]]) -> list["Message"]:
    """Batch k + 2 built here while k + 1 is written by a helper thread and k published by another; once a
    publish or a write fails, no later batch is published, those written deleted."""
    go_on = threading.Event()
    go_on.set()

    def publish(batch: Batch, stored: "Future") -> None:
        # A write's error is raised by _settle.
        if stored.exception() is not None or (go_on.is_set() and not batch.publish()):
            go_on.clear()

    sent: list[Message] = []
    pending: collections.deque = collections.deque()
    with ThreadPoolExecutor(1, thread_name_prefix="send-many-db") as db, \
            ThreadPoolExecutor(1, thread_name_prefix="send-many-publish") as pub:
        try:
            for items in work:
                batch = Batch(suite, config, actor, delay, items)
                stored = db.submit(batch.store)
                pending.append((batch, stored, pub.submit(publish, batch, stored)))
                if len(pending) > 2:
                    sent += _settle(*pending.popleft())
            while pending:
                sent += _settle(*pending.popleft())
        except BaseException:
            go_on.clear()
            for batch, stored, published in pending:
                published.result()
                if stored.exception() is None:
                    batch.undo()
            raise
        finally:
            db.submit(suite.close).result()  # the helper's database connections
    return sent


def _settle(batch: Batch, stored: "Future", published: "Future") -> list["Message"]:
    published.result()
    stored.result()  # its error, if the write failed
    return batch.settle()


def _single(actor: "Actor", item: Item, delay: Optional[int]) -> "Message":
    return actor.send_with_options(args=item[0], kwargs=item[1], delay=delay)


@dataclasses.dataclass
class _Row:
    message: "Message"  # as the broker's enqueue would publish it
    original: "Message"  # as the actor made it (a duplicate returns it with the holder's id)
    fields: dict
    key: Optional[str]
    holds: bool
    resolved: Optional["Message"] = None
    single: bool = False  # left to the single send, after the batch


class Batch:
    """One batch of a tracked actor's items: built (in the sender's thread: context variables), stored,
    published (maybe in another thread while the next batch is stored), settled."""

    def __init__(self, suite: "Suite", config: "ActorConfig", actor: "Actor", delay: Optional[int],
                 items: list[Item]) -> None:
        self.suite, self.config, self.actor, self.delay = suite, config, actor, delay
        self.broker = actor.broker
        self.conflict = config.unique_on_conflict
        self.held = outbox.active()
        # The broker failed a moment ago: kept pending without trying it (durable/deferral.py).
        self.deferred = self.held is None and deferral.skip_publish(suite)
        self.model = config.model
        self.rows = [self._row(args, kwargs) for args, kwargs in items]
        self.inserted: list[_Row] = []
        #: How to undo the rows to publish, or keep them for the re-drive (unique/enqueue.py).
        self.created: list[Created] = []
        self.error: Optional[BaseException] = None
        self.published = False

    def store(self) -> None:
        """Write the rows, resolve duplicates; those to publish in ``self.inserted``."""
        first: dict[str, _Row] = {}
        writes: list[_Row] = []
        for row in self.rows:
            # A duplicate inside the batch is left out: its first item holds the key.
            if not row.holds or first.setdefault(row.key, row) is row:  # type: ignore[arg-type]
                writes.append(row)
        ids = self._insert(writes)
        self._resolve(self.rows, ids, first)
        self.inserted = [row for row in writes if row.message.message_id in ids]
        for row in self.inserted:  # marked; those held for the outbox or kept pending are settled now
            row.message.options[MARKER] = {**row.fields["options"][MARKER], "id": ids[row.message.message_id], "rev": 0}
            if self.held is not None:
                row.resolved = self.held.defer(self.broker, row.message, self.delay, (self.model, _id(row), 0)).message
            elif self.deferred:
                row.resolved = dataclasses.replace(row.message, options=job_options(row.message.options))
        if self.held is not None or self.deferred:
            self.inserted = []  # nothing to publish now
        self.created = [made_row(self.suite, self.model, _id(row), row.fields, row.key if row.holds else None)
                        for row in self.inserted]

    def settle(self) -> list["Message"]:
        """After the publish: a failure kept or undone (and raised), then the items left to the single send."""
        if self.inserted and not self.published:
            error = self.error or RuntimeError("not published")
            if not publish_failed(self.suite, self.broker, self.created, error):
                raise error
        elif self.inserted:
            deferral.published(self.broker)
            for row in self.inserted:
                self.broker.emit_after("enqueue", row.message, self.delay)
        for row in self.inserted:
            row.resolved = row.message
        for row in self.rows:
            if row.single:
                row.resolved = _single(self.actor, (row.original.args, row.original.kwargs), self.delay)
        return [row.resolved for row in self.rows]  # type: ignore[misc]

    def undo(self) -> None:
        """Delete the rows written and never published, and free their locks (if taken, else no-ops)."""
        if not self.published:
            undo_all(self.created)

    def _row(self, args: tuple, kwargs: dict) -> _Row:
        original = self.actor.message_with_options(args=args, kwargs=kwargs)
        check_options(self.suite, original, self.delay)
        message = original.copy(options={REDIS_MESSAGE_ID: str(uuid.uuid4())})  # as RedisBroker.enqueue does
        if self.delay is not None:
            message = message.copy(queue_name=dq_name(message.queue_name),
                                   options={"eta": current_millis() + self.delay})
        fields, key, holds = new_row(self.config, message, self.delay,  # published at commit, or by the re-drive
                                     pending=self.held is not None or self.deferred, deferred=self.deferred)
        return _Row(message, original, fields, key, holds)

    def _insert(self, writes: list[_Row]) -> dict[str, int]:
        """The batch's multi-row INSERT, on the primary unless every row may fail over."""
        if not writes:
            return {}
        # In the keys' order: two batches of the same keys wait on each other in one order, never a deadlock.
        holding = any(row.holds for row in writes)
        fields = [row.fields for row in (sorted(writes, key=lambda row: row.key or "") if holding else writes)]
        marker: dict = dict(fields[0]["options"][MARKER])
        if not holding:  # the same for every row without a key: it gets the store's index, as a single send's
            for row in fields:
                row["options"][MARKER] = marker
        with guarded(f"recording {len(writes)} {self.config.actor_name} jobs"):
            self.model, ids = store(self.suite, self.config, {}, self.held,
                                    lambda target: jobs.insert_many(target, fields), marker)
        return ids

    def _resolve(self, rows: list[_Row], ids: dict[str, int], first: dict[str, _Row]) -> None:
        """Settle every row not inserted: a duplicate of a job in the table or of an earlier item."""
        lost = [row for row in rows if row.message.message_id not in ids and first.get(row.key) is row]  # type: ignore[arg-type]
        if any(not row.holds for row in lost):
            raise DatabaseUnavailable(f"a {self.config.actor_name} job row was refused without a key held")
        found: dict = {}
        if lost:
            with guarded(f"looking up the holders of {len(lost)} {self.config.actor_name} keys"):
                found = jobs.holders(self.model, [row.key for row in lost], self.config.app)  # type: ignore[misc]
        window = recent.window(self.config, {}, self.config.unique_lock)
        for row in rows:
            if row.message.message_id in ids:
                continue
            head = first.get(row.key)  # type: ignore[arg-type]
            own = head is not row and head is not None and head.message.message_id in ids  # the batch's job holds it
            holder: Any = head.message if own else found.get(row.key)  # type: ignore[union-attr]
            # replace, a key let go meanwhile, an outlived holder: as one send, after the batch
            if self.conflict != "skip" or holder is None or (not own and jobs._outlived(holder, window)):
                row.single = True
                continue
            events.duplicate("skip", row.original, holder.message_id, row.key)
            row.resolved = row.original.copy(message_id=holder.message_id)

    def publish(self) -> bool:
        """Publish ``self.inserted``, queue locks first (no database call, no context variable: maybe in another
        thread); an error is kept for :meth:`settle`.  Returns whether later batches may go on."""
        publisher = self.suite.publisher
        assert publisher is not None
        try:
            entries = []
            for row in self.inserted:
                lock = None
                if row.holds:
                    ttl = queue_lock_ttl(self.config, {}, self.config.unique_lock, self.delay)
                    lock = (self.suite.keys.queue_lock(str(row.key)), row.message.message_id, ttl)
                ref = row.message.options[REDIS_MESSAGE_ID]
                entries.append((row.message.queue_name, ref, row.message.encode(), lock))
            if entries:
                publisher.publish_many(entries)
            self.published = True
        except BaseException as error:  # noqa: BLE001  (raised by settle, in the sender's thread)
            self.error = error
            return deferral.defers(self.suite, error)
        return True


def _id(row: _Row) -> int:
    return int(row.message.options[MARKER]["id"])
