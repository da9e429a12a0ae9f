"""Sending many jobs at once: :func:`send_many`.

A batch of up to ``send_many_batch`` items of a tracked actor is one multi-row INSERT with
``ON CONFLICT DO NOTHING RETURNING`` (:func:`dramatiq_unique.storage.jobs.insert_many`): a row
whose unique key another job holds is left out, and the holders of those keys are read in one query.
Then the rows inserted are published in one round trip on the Redis broker
(:meth:`dramatiq_unique.broker.publish.Publisher.publish_many`), queue locks with them.  Each row is
what a single send writes (:func:`dramatiq_unique.unique.enqueue.row_fields`, the same marker), so
workers, the re-drive and the outbox see no difference.

What the bulk path does not do itself goes through the single send, item by item, in order:
an untracked actor, a broker other than Redis (RabbitMQ: Dramatiq publishes per message), an actor
with ``unique_on_conflict="raise"`` (the items before a duplicate are sent, the rest are not, as in
a loop), a broker with another middleware's ``before_enqueue``; and, after the batch is published,
the items of a ``replace`` actor that met a holder, and a duplicate whose holder let the key go
between the INSERT and its lookup (the single send settles the race as it does for one).
"""

from __future__ import annotations

import collections
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Iterable, Optional

from dramatiq_unique import options as opt
from dramatiq_unique import suite as _config
from dramatiq_unique.durable import outbox
from dramatiq_unique.errors import InvalidOption, NotConfigured
from dramatiq_unique.unique.bulk_batch import Batch, Item, _single

if TYPE_CHECKING:
    from dramatiq import Actor, Message

    from dramatiq_unique.suite import ActorConfig, Suite


def items_of(items: Iterable[Any]) -> list[Item]:
    """Each item as ``(args, kwargs)``: an args tuple (or list), a kwargs dict, or an ``(args, kwargs)``
    pair.  All are checked before anything is sent."""
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
    it (a duplicate's message is the existing job's).  How each option behaves in bulk: the docs' how-to,
    "Sending many jobs at once" (docs/howto/send-many.md)."""
    parsed = items_of(items)
    opt.check_delay(delay)
    try:
        suite: Optional[Suite] = _config.current()
    except NotConfigured:
        suite = None
    config = suite.actor_config(actor.actor_name) if suite is not None else None
    size = suite.settings.send_many_batch if suite is not None else 1_000
    if suite is None or config is None or not _bulk(suite, config, actor):
        return [_single(actor, item, delay) for item in parsed]
    work = batches(parsed, size)
    # In transaction(), or in a transaction of the caller's own: the INSERT goes through the caller's
    # connection, in this thread (a helper's connection would wait on the caller's locks).
    if len(work) == 1 or outbox.active() is not None or any(db.in_transaction() for db in suite.stores.databases):
        sent: list[Message] = []
        for items in work:
            batch = Batch(suite, config, actor, delay)
            batch.build(items)
            batch.store()
            batch.publish()
            sent += batch.settle()
        return sent
    return _pipelined(suite, config, actor, delay, work)


def _pipelined(suite: "Suite", config: "ActorConfig", actor: "Actor", delay: Optional[int],
               work: list[list[Item]]) -> list["Message"]:
    """Batch k + 2 is built in this thread while batch k + 1 is written by a helper thread and batch k
    published by another: the INSERT and the publish mostly wait on their servers, the GIL let go.
    Publishes keep their order; once one fails for good (or a write), no later batch is published,
    and those written are deleted before the error is raised."""
    go_on = threading.Event()
    go_on.set()

    def publish(batch: Batch, stored: "Future") -> None:
        try:
            stored.result()
        except BaseException:  # noqa: BLE001  (raised by settle)
            go_on.clear()
            return
        if go_on.is_set() and not batch.publish():
            go_on.clear()

    sent: list[Message] = []
    pending: collections.deque = collections.deque()
    with ThreadPoolExecutor(1, thread_name_prefix="send-many-db") as db, \
            ThreadPoolExecutor(1, thread_name_prefix="send-many-publish") as pub:
        try:
            for items in work:
                batch = Batch(suite, config, actor, delay)
                batch.build(items)
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


def _bulk(suite: "Suite", config: "ActorConfig", actor: "Actor") -> bool:
    """Whether a batch of ``actor`` takes the bulk path (see the module's docs)."""
    if actor.broker is not suite.broker or suite.publisher is None or not suite.publisher.batches():
        return False
    return not config.unique or config.unique_on_conflict != "raise"
