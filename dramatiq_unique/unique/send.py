"""A send through the suite: Dramatiq's ``broker.enqueue``, wrapped once per broker, around the
``before_enqueue`` hooks that record it (docs/discussions/how-it-is-built.md, "Sending")."""

from __future__ import annotations

import contextlib
import functools
import logging
from typing import TYPE_CHECKING, Any, Callable, Iterator, Optional

import redis

from dramatiq_unique import options as opt
from dramatiq_unique import suite as _config
from dramatiq_unique.broker import keys
from dramatiq_unique.broker.publish import Publisher
from dramatiq_unique.broker.refs import is_resending
from dramatiq_unique.context import MARKER
from dramatiq_unique.durable import deferral, outbox
from dramatiq_unique.errors import InvalidOption, RedisPermissionDenied, permission_refused
from dramatiq_unique.guard import describe, guarded
from dramatiq_unique.unique import recent
from dramatiq_unique.unique.enqueue import Created, Redirect, created_rows, publish_failed

if TYPE_CHECKING:
    from dramatiq import Broker, Message

    from dramatiq_unique.suite import Suite

logger = logging.getLogger(__name__)


def install_enqueue(broker: "Broker", suite: "Suite") -> None:
    """Wrap ``broker.enqueue`` (once) so redirects return and failed publishes leave no row."""
    if getattr(broker.enqueue, "_dramatiq_unique", False):
        return
    keys.check(broker)
    original = broker.enqueue
    suite.publisher = Publisher.install(broker, suite)

    @functools.wraps(original)
    def enqueue(message: "Message", *, delay: Optional[int] = None) -> "Message":
        created: list[Created] = []
        token = created_rows.set(created)
        armed = suite.publisher.arm() if suite.publisher is not None else None
        try:
            with guarded(f"checking {describe(message)} for a duplicate"):
                check_options(suite, message, delay)
                holder = recent.skip_early(suite, message)
            if holder is not None:
                return message.copy(message_id=holder)
            sent = original(message, delay=delay)
            deferral.published(broker)
            return sent
        except Redirect as redirect:
            if redirect.resend is None:
                return message.copy(message_id=redirect.message_id)
            marker = redirect.resend["marker"]
            resent = message.copy(message_id=redirect.message_id, options={MARKER: marker})
            held = outbox.active()
            if held is not None:  # with its row, which the replace set pending: claimed at the commit
                row = (redirect.resend["model"], marker["id"], marker["rev"])
                return held.defer(broker, resent, delay, row, stamp=redirect.resend["stamp"]).message
            return _resend_replaced(suite, broker, original, resent, delay)
        except outbox.Deferred as deferred:  # inside transaction(): published after commit; or kept pending
            return deferred.message
        except BaseException as error:
            if publish_failed(suite, broker, created, error):
                return message
            kept = _record_pending(suite, broker, message, delay, error) if not created else None
            if kept is not None:
                return kept
            if isinstance(error, redis.ResponseError) and permission_refused(error):
                raise RedisPermissionDenied(f"sending {describe(message)}: {error}") from error
            raise
        finally:
            created_rows.reset(token)
            if armed is not None:
                armed.var.reset(armed)

    enqueue._dramatiq_unique = True  # type: ignore[attr-defined]
    broker.enqueue = enqueue  # type: ignore[method-assign]


def _record_pending(
    suite: "Suite", broker: "Broker", message: "Message", delay: Optional[int], error: BaseException,
) -> Optional["Message"]:
    """A tracked send the broker failed before it was recorded (RabbitMQ declaring a new queue): recorded pending
    if the broker is down (on_broker_down="defer"); returns the message, or None to raise."""
    if not deferral.defers(suite, error) or MARKER in message.options or is_resending() \
            or suite.actor_config(message.actor_name) is None:
        return None
    try:
        with deferral.skipping():
            broker.emit_before("enqueue", message, delay)
        return None  # pragma: no cover  (a tracked send always raises Deferred here)
    except outbox.Deferred as deferred:
        deferral.failed(suite, broker, error)
        return deferred.message


def _resend_replaced(
    suite: "Suite", broker: "Broker", original: Callable[..., "Message"], resent: "Message", delay: Optional[int]
) -> "Message":
    """Send a job whose arguments a duplicate replaced; if the broker is down, it waits pending."""
    try:
        sent = original(resent, delay=delay)
    except BaseException as error:
        config = suite.actor_config(resent.actor_name)
        if config is None or not deferral.defers(suite, error):
            raise
        marker = resent.options[MARKER]
        deferral.keep_replaced(config.model, marker["id"], marker["rev"])
        deferral.failed(suite, broker, error)
        return resent
    deferral.published(broker)
    return sent


def check_options(suite: "Suite", message: "Message", delay: Optional[int] = None) -> None:
    """A send's own suite options and delay, checked as the actor's were at declaration (not a retry's)."""
    opts = message.options
    if MARKER in opts:
        return
    config = suite.actor_config(message.actor_name)
    if config is not None:
        opt.check_delay(delay)
        opt.check_send(opts, config.options, config.fn, broker=suite.broker, actor_name=message.actor_name)
        return
    given = opts.keys() & opt.SUITE_OPTIONS
    if given:
        raise InvalidOption(
            f"{', '.join(sorted(given))} on a message of {message.actor_name}, which the suite does not track, "
            f"would do nothing: declare the actor with track=True or a suite option"
        )


@contextlib.contextmanager
def transaction(*, suite: Optional["Suite"] = None) -> Iterator[Any]:
    """A database transaction whose sends are published only after it commits.

    Yields peewee's transaction object.  Nested blocks are savepoints.
    The sends follow the transaction: those made inside a savepoint
    that rolls back (a nested block, a nested ``atomic()``) or before
    the transaction's rollback are never published; the rest are
    published when the outermost transaction commits (the caller's
    own, if it holds one on the same database).  See
    :mod:`dramatiq_unique.durable.outbox`.
    """
    suite = suite or _config.current()
    if suite.broker is not None:
        install_enqueue(suite.broker, suite)
    with outbox.opened(suite) as txn:
        yield txn
