"""One batch of :func:`dramatiq_unique.send_many` on the bulk path (:mod:`dramatiq_unique.unique.bulk`):
written (:meth:`Batch.write`), published (:meth:`Batch.publish`, maybe in another thread while the
next batch is written), and settled (:meth:`Batch.settle`)."""

from __future__ import annotations

import dataclasses
import uuid
from typing import TYPE_CHECKING, Optional

from dramatiq.common import current_millis, dq_name

from dramatiq_unique import options as opt
from dramatiq_unique.broker.refs import REDIS_MESSAGE_ID
from dramatiq_unique.context import MARKER
from dramatiq_unique.durable import deferral, outbox
from dramatiq_unique.durable.messages import job_options
from dramatiq_unique.errors import DatabaseUnavailable
from dramatiq_unique.observe import events
from dramatiq_unique.storage import jobs
from dramatiq_unique.storage.models import JobStatus
from dramatiq_unique.unique import recent
from dramatiq_unique.unique.enqueue import _needs, may_fail_over, queue_lock_ttl, row_fields, take_queue_lock
from dramatiq_unique.unique.send import check_options

if TYPE_CHECKING:
    from dramatiq import Actor, Message

    from dramatiq_unique.suite import ActorConfig, Suite

Item = tuple[tuple, dict]


def _single(actor: "Actor", item: Item, delay: Optional[int]) -> "Message":
    """One item through the single send."""
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
    """One batch of a tracked actor's items (see :mod:`dramatiq_unique.unique.bulk`)."""

    def __init__(self, suite: "Suite", config: "ActorConfig", actor: "Actor", delay: Optional[int]) -> None:
        self.suite, self.config, self.actor, self.delay = suite, config, actor, delay
        self.broker = actor.broker
        self.lock = config.unique_lock
        self.conflict = config.unique_on_conflict
        self.held = outbox.active()
        # The broker failed a moment ago: kept pending without trying it (durable/deferral.py).
        self.deferred = self.held is None and deferral.skip_publish(suite)
        self.model = config.model
        self.rows: list[_Row] = []
        self.inserted: list[_Row] = []
        self.error: Optional[BaseException] = None
        self.published = False
        self.taken: list[tuple[str, str]] = []

    def build(self, items: list[Item]) -> None:
        """The batch's messages and rows, checked (in the sender's thread: context variables)."""
        self.rows = [self._row(args, kwargs) for args, kwargs in items]

    def store(self) -> None:
        """The rows written, duplicates resolved, the rows to publish in ``self.inserted`` (none if they
        wait for the outbox or the re-drive).  May run in another thread, unless in transaction()."""
        first: dict[str, _Row] = {}
        writes: list[_Row] = []
        for row in self.rows:
            if row.holds and row.key in first:  # a duplicate inside the batch: its first item holds the key
                continue
            if row.holds:
                first[row.key] = row  # type: ignore[index]
            writes.append(row)
        ids = self._insert(writes)
        self._resolve(self.rows, ids, first)
        self.inserted = [row for row in writes if row.message.message_id in ids]
        self._finish(self.inserted, ids)

    def settle(self) -> list["Message"]:
        """After the publish: what it failed kept or undone (and raised), then the items left to the
        single send; returns one message per item."""
        if self.inserted and not self.published:
            self._failed(self.inserted, self.taken, self.error or RuntimeError("not published"))
        elif self.inserted:
            deferral.published(self.broker)
            for row in self.inserted:
                self.broker.emit_after("enqueue", row.message, self.delay)
                row.resolved = row.message
        for row in self.rows:
            if row.single:
                row.resolved = _single(self.actor, (row.original.args, row.original.kwargs), self.delay)
        return [row.resolved for row in self.rows]  # type: ignore[misc]

    def undo(self) -> None:
        """An earlier batch failed and raises: this one, written and never published, is deleted."""
        if self.inserted and not self.published:
            self.model.delete().where(self.model.id.in_([ids_of(row) for row in self.inserted])).execute()

    def _row(self, args: tuple, kwargs: dict) -> _Row:
        original = self.actor.message_with_options(args=args, kwargs=kwargs)
        check_options(self.suite, original, self.delay)
        message = original.copy(options={REDIS_MESSAGE_ID: str(uuid.uuid4())})  # as RedisBroker.enqueue does
        if self.delay is not None:
            message = message.copy(queue_name=dq_name(message.queue_name),
                                   options={"eta": current_millis() + self.delay})
        key = recent.key_of(self.config, message)
        fields = row_fields(self.config, message, self.delay)
        fields["unique_key"] = key
        if self.held is not None or self.deferred:  # published at commit, or by the re-drive
            fields.update(status=JobStatus.PENDING.value, enqueued_at=None, broker_ref=None)
        holds = key is not None and self.lock in opt.QUEUE_LOCKS
        marker: dict = {"qt": message.message_id} if holds else {}
        if self.deferred:
            marker[deferral.DEFERRED] = 1
        fields["options"][MARKER] = marker
        if holds:
            fields["unique_hold"] = key
        return _Row(message, original, fields, key, holds)

    def _insert(self, writes: list[_Row]) -> dict[str, int]:
        """The batch's multi-row INSERT, on the primary unless every row may fail over."""
        if not writes:
            return {}
        # In the keys' order: two batches of the same keys wait on each other in one order, never a deadlock.
        holding = any(row.holds for row in writes)
        fields = [row.fields for row in (sorted(writes, key=lambda row: row.key or "") if holding else writes)]
        what = f"recording {len(writes)} {self.config.actor_name} jobs"
        stores = self.suite.stores
        if stores.several and self.held is None and not holding and may_fail_over(self.config, {}):
            shared: dict = dict(fields[0]["options"][MARKER])  # the same for every row: no key
            for row in fields:
                row["options"][MARKER] = shared  # gets the store's index, as a single send's marker
            with jobs.db_errors(what):
                self.model, ids = stores.insert(self.model, lambda target: jobs.insert_many(target, fields),
                                                shared)
            return ids
        with jobs.db_errors(what):
            return stores.on_primary(self.model, lambda: _needs(self.config, {}, self.held),
                                     lambda: jobs.insert_many(self.model, fields))

    def _resolve(self, rows: list[_Row], ids: dict[str, int], first: dict[str, _Row]) -> None:
        """Settle every row that was not inserted: a duplicate of a job in the table or of an
        earlier item of the batch."""
        lost = [row for row in rows if row.message.message_id not in ids and first.get(row.key) is row]  # type: ignore[arg-type]
        if any(not row.holds for row in lost):
            raise DatabaseUnavailable(f"a {self.config.actor_name} job row was refused without a key held")
        found: dict = {}
        if lost:
            with jobs.db_errors(f"looking up the holders of {len(lost)} {self.config.actor_name} keys"):
                found = jobs.holders(self.model, [row.key for row in lost], self.config.app)  # type: ignore[misc]
        window = recent.window(self.config, {}, self.lock)
        for row in rows:
            if row.message.message_id in ids:
                continue
            head = first.get(row.key)  # type: ignore[arg-type]
            if head is not row and head is not None and head.message.message_id in ids:
                holder_id = head.message.message_id  # the batch's own job holds the key
            else:
                holder = found.get(row.key)
                if holder is None or jobs._outlived(holder, window) or self.conflict != "skip":
                    row.single = True  # replace, a key let go meanwhile, an outlived holder: as one send
                    continue
                holder_id = holder.message_id
            if self.conflict != "skip":
                row.single = True
                continue
            events.duplicate("skip", row.original, holder_id, row.key)
            row.resolved = row.original.copy(message_id=holder_id)

    def _finish(self, inserted: list[_Row], ids: dict[str, int]) -> None:
        """Publish the rows inserted (or hold them for the outbox, or keep them pending)."""
        for row in inserted:
            marker = {**row.fields["options"][MARKER], "id": ids[row.message.message_id], "rev": 0}
            row.message.options[MARKER] = marker
        if self.held is not None:
            for row in inserted:
                row_ref = (self.model, ids[row.message.message_id], 0)
                row.resolved = self.held.defer(self.broker, row.message, self.delay, row_ref).message
        if self.deferred:
            for row in inserted:
                row.resolved = dataclasses.replace(row.message, options=job_options(row.message.options))
        if self.held is not None or self.deferred:
            self.inserted = []  # nothing to publish now

    def publish(self) -> bool:
        """Publish ``self.inserted`` in one round trip; may run in another thread (no database
        call, no context variable): an error is kept for :meth:`settle`, and says whether the
        batches after it may still be published (not if it raises: on_broker_down="raise")."""
        publisher = self.suite.publisher
        assert publisher is not None
        if not self.inserted:
            self.published = True
            return True
        entries = []
        try:
            for row in self.inserted:
                lock = None
                if row.holds:
                    name = self.suite.keys.queue_lock(str(row.key))
                    ttl = queue_lock_ttl(self.config, {}, self.lock, self.delay)
                    lock = (name, row.message.message_id, ttl)
                    if not publisher.locks:  # the locks live elsewhere: taken before the publish
                        take_queue_lock(self.suite, row.message, name, ttl)
                        self.taken.append((name, row.message.message_id))
                        lock = None
                ref = row.message.options[REDIS_MESSAGE_ID]
                entries.append((row.message.queue_name, ref, row.message.encode(), lock))
            if entries:
                publisher.publish_many(entries)
            self.published = True
        except BaseException as error:  # noqa: BLE001  (raised by settle, in the sender's thread)
            self.error = error
            return deferral.defers(self.suite, error)
        return True

    def _failed(self, inserted: list[_Row], taken: list[tuple[str, str]], error: BaseException) -> None:
        """The publish failed: nothing of it was published (MULTI/EXEC).  The rows are kept pending
        for the re-drive if the broker is down (on_broker_down="defer"), else undone, and it raises."""
        if deferral.defers(self.suite, error):
            for row in inserted:
                deferral.keep(self.model, ids_of(row), row.fields["broker_ref"], row.fields["options"])
                row.resolved = row.message
            deferral.failed(self.suite, self.broker, error)
            return
        self.model.delete().where(self.model.id.in_([ids_of(row) for row in inserted])).execute()
        for name, token in taken:
            try:
                self.suite.locks.release(name, token)
            except Exception:  # often the very failure being undone: it expires by itself
                pass
        raise error


def ids_of(row: _Row) -> int:
    return int(row.message.options[MARKER]["id"])
