"""A send through the suite: Dramatiq's ``broker.enqueue``, wrapped once per broker, around the
``before_enqueue`` hooks that record it (docs/discussions/how-it-is-built.md, "Sending"); :func:`transaction`,
whose sends wait for its commit; and :func:`submit`, whose idempotency key returns the same job for the same key,
held in the row's ``idempotency_hold`` under a unique index on ``(app, idempotency_hold)``, scoped to
``(app, actor, owner)`` for the idempotency window."""

from __future__ import annotations

import contextlib
import functools
import logging
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Callable, Iterator, Optional, Union

import dramatiq
import redis
from dramatiq.brokers.redis import RedisBroker

from dramatiq_unique import options as opt
from dramatiq_unique import suite as _config
from dramatiq_unique.broker import refs
from dramatiq_unique.broker.publish import Publisher
from dramatiq_unique.context import MARKER, job_model
from dramatiq_unique.durable import deferral, outbox
from dramatiq_unique.durable.messages import args_from_row
from dramatiq_unique.durable.scope import NO_APP
from dramatiq_unique.errors import IdempotencyKeyReused, InvalidOption, RedisPermissionDenied, permission_refused
from dramatiq_unique.guard import describe, guarded
from dramatiq_unique.storage.models import JobModel, after_ms
from dramatiq_unique.unique import recent
from dramatiq_unique.unique.enqueue import Created, Redirect, created_rows, publish_failed
from dramatiq_unique.unique.keys import bind_arguments, canonical, idempotency_hold

if TYPE_CHECKING:
    from dramatiq import Broker, Message

    from dramatiq_unique.suite import Suite

logger = logging.getLogger(__name__)


def install_enqueue(broker: "Broker", suite: "Suite") -> None:
    """Wrap ``broker.enqueue`` (once) so redirects return and failed publishes leave no row."""
    if getattr(broker.enqueue, "_dramatiq_unique", False):
        return
    refs.check(broker)
    original = broker.enqueue
    suite.publisher = Publisher(broker, suite) if isinstance(broker, RedisBroker) else None

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


def uninstall_enqueue(broker: "Broker") -> None:
    """Give ``broker`` back the ``enqueue`` that :func:`install_enqueue` wrapped, if it wrapped one."""
    if getattr(broker.enqueue, "_dramatiq_unique", False):
        broker.enqueue = broker.enqueue.__wrapped__  # type: ignore[attr-defined,method-assign]  # functools.wraps'


def _record_pending(
    suite: "Suite", broker: "Broker", message: "Message", delay: Optional[int], error: BaseException,
) -> Optional["Message"]:
    """A tracked send the broker failed before it was recorded (RabbitMQ declaring a new queue): recorded pending
    if the broker is down (on_broker_down="defer"); returns the message, or None to raise."""
    if not deferral.defers(suite, error) or MARKER in message.options or refs.is_resending() \
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
def transaction(*, suite: Optional["Suite"] = None, session: Any = None) -> Iterator[Any]:
    """A database transaction whose sends are published only after it commits.

    Yields peewee's transaction object.  Nested blocks are savepoints.
    The sends follow the transaction: those made inside a savepoint
    that rolls back (a nested block, a nested ``atomic()``) or before
    the transaction's rollback are never published; the rest are
    published when the outermost transaction commits (the caller's
    own, if it holds one on the same database).  See
    :mod:`dramatiq_unique.durable.outbox`.

    ``session``: an SQLAlchemy ``Session`` on the engine given to
    :func:`setup`.  The block's sends then join the session's transaction
    (begun if it has none, as the session's own autobegin does), follow its
    savepoints, and are published after its commit, whenever that comes,
    in the block or after it; yields the session.
    """
    suite = suite or _config.current()
    if suite.broker is not None:
        install_enqueue(suite.broker, suite)
    if session is not None:
        following = getattr(suite.db, "following", None)  # contrib/sqlalchemy.py's EngineDatabase
        if following is None:
            raise InvalidOption("transaction(session=...) needs setup(database=engine), an SQLAlchemy engine")
        with following(session):
            yield session
        return
    with outbox.opened(suite) as txn:
        yield txn


def submit(
    actor: dramatiq.Actor,
    *args: Any,
    idempotency_key: Optional[str] = None,
    owner: Optional[str] = None,
    delay: Optional[Union[int, timedelta]] = None,
    **kwargs: Any,
) -> tuple[JobModel, bool]:
    """Send a job unless the key already made one; returns ``(job, created)``.

    With ``idempotency_key``, a later call for the same actor with the same ``(owner, idempotency_key)``
    within the window returns the same job, whatever its state, and sends nothing; reusing a key with other
    arguments raises :class:`IdempotencyKeyReused`.  Without a key it behaves like ``send()`` and tells
    whether a new job was made.  Meant for HTTP producers: 201 when created, 202 when not.
    """
    suite = _config.current()
    config = suite.actor_config(actor.actor_name)
    if config is None:
        raise InvalidOption(f"submit() needs a tracked actor: give {actor.actor_name} track=True or a suite option")
    if isinstance(delay, timedelta):
        delay = int(delay.total_seconds() * 1000)
    opt.check_delay(delay)
    model = config.model
    options: dict[str, Any] = {}
    hold = None
    if idempotency_key is not None:
        options = {"idempotency_key": idempotency_key, "owner": None if owner is None else str(owner)}
        opt.check_send(options, {}, config.fn)
        hold = idempotency_hold(actor.actor_name, options["owner"], idempotency_key)
        suite.stores.check_primary(f"an idempotent send of {actor.actor_name}")  # keys live in the primary
        # This app's job, else one written before rows had an app (not yet adopted, scope.py): a client
        # retrying across an upgrade gets its job back.  Both probe one index.
        with guarded(f"looking up idempotency key {idempotency_key!r}"):
            rows = list(model.select().where(model.app.in_([config.app, NO_APP]) & (model.idempotency_hold == hold))
                        .limit(2))
        existing = next((row for row in rows if row.app == config.app), rows[0] if rows else None)
        if existing is not None:
            if existing.created_at > after_ms(-config.idempotency_window):
                return _same_request(config.fn, existing, args, kwargs), False
            # The key outlived its window: it may make a new job.
            unheld = (model.id == existing.id) & (model.idempotency_hold == hold)
            model.update(idempotency_hold=None).where(unheld).execute()
    message = actor.message_with_options(args=args, kwargs=kwargs, **options)
    sent = actor.broker.enqueue(message, delay=delay)
    job = job_model(suite, model, sent.options).get_or_none(message_id=sent.message_id)  # its row's store
    if job is None:  # pragma: no cover - the row is written before the message is published
        raise LookupError(f"no job row for message {sent.message_id}")
    created = sent.message_id == message.message_id
    if not created and hold is not None and job.idempotency_hold == hold:
        _same_request(config.fn, job, args, kwargs)  # a racing submit with this key won
    return job, created


def _same_request(fn: Any, job: JobModel, args: tuple, kwargs: dict) -> JobModel:
    """``job`` if it was made with these arguments; else the key was reused: an error, as Stripe does."""
    sent_args, sent_kwargs = args_from_row(job.args, job.kwargs)
    if canonical(bind_arguments(fn, sent_args, sent_kwargs)) != canonical(bind_arguments(fn, args, kwargs)):
        raise IdempotencyKeyReused(
            f"key {job.idempotency_key!r} made job {job.message_id} with other arguments", job=job
        )
    return job
