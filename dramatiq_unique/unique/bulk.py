"""Sending many jobs at once: :func:`send_many`.

A batch of up to ``send_many_batch`` items of a tracked actor is one multi-row INSERT with
``ON CONFLICT DO NOTHING RETURNING`` (:func:`dramatiq_unique.storage.statements.insert_many`): a row
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

from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Iterable, Optional

from dramatiq import Middleware

from dramatiq_unique import options as opt
from dramatiq_unique import suite as _config
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
    it (a duplicate's message is the existing job's).  See the README, "Sending many jobs at once"."""
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
    # Batch k is published in this thread while batch k + 1 is written: the INSERT and the publish
    # mostly wait on their servers, each with the GIL let go.
    pool = ThreadPoolExecutor(1, thread_name_prefix="dramatiq-unique-send-many") if len(work) > 1 else None
    sent: list[Message] = []
    previous: Optional[tuple[Batch, Optional[Future]]] = None
    try:
        for items in work:
            batch = Batch(suite, config, actor, delay)
            batch.write(items)
            if previous is not None:
                try:
                    sent += previous[0].settle(previous[1])
                except BaseException:
                    batch.undo()  # written, never published: no phantom jobs
                    raise
            future = pool.submit(batch.publish) if pool is not None and batch.inserted else None
            if future is None:
                batch.publish()
            previous = (batch, future)
        if previous is not None:
            sent += previous[0].settle(previous[1])
    finally:
        if pool is not None:
            pool.shutdown(wait=True)
    return sent


def _bulk(suite: "Suite", config: "ActorConfig", actor: "Actor") -> bool:
    """Whether a batch of ``actor`` takes the bulk path (see the module's docs)."""
    broker = actor.broker
    if broker is not suite.broker or suite.publisher is None or not getattr(broker.enqueue, "_dramatiq_unique", 0):
        return False
    if config.get({}, "unique_args") is not None and \
            config.get({}, "unique_on_conflict", opt.DEFAULT_UNIQUE_ON_CONFLICT) == "raise":
        return False
    hooks = [m for m in broker.middleware if type(m).before_enqueue is not Middleware.before_enqueue]
    return all(getattr(m, "suite", None) is suite for m in hooks)  # JobTracking's alone


