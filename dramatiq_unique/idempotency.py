"""Idempotency keys: :func:`submit` returns the same job for the same key, held in the row's
``idempotency_hold`` under a unique index on ``(app, idempotency_hold)``, scoped to ``(app, actor, owner)``
for the idempotency window."""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Optional, Union

import dramatiq

from dramatiq_unique.context import job_model
from dramatiq_unique.durable.messages import args_from_row
from dramatiq_unique.durable.scope import NO_APP
from dramatiq_unique.errors import IdempotencyKeyReused, InvalidOption
from dramatiq_unique.guard import guarded
from dramatiq_unique.options import check_delay, check_send
from dramatiq_unique.storage import jobs
from dramatiq_unique.storage.models import JobModel, after_ms
from dramatiq_unique.suite import current
from dramatiq_unique.unique.keys import bind_arguments, canonical, idempotency_hold


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
    suite = current()
    config = suite.actor_config(actor.actor_name)
    if config is None:
        raise InvalidOption(f"submit() needs a tracked actor: give {actor.actor_name} track=True or a suite option")
    if isinstance(delay, timedelta):
        delay = int(delay.total_seconds() * 1000)
    check_delay(delay)
    model = config.model
    options: dict[str, Any] = {}
    hold = None
    if idempotency_key is not None:
        options = {"idempotency_key": idempotency_key, "owner": None if owner is None else str(owner)}
        check_send(options, {}, config.fn)
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
    job = jobs.get(job_model(suite, model, sent.options), message_id=sent.message_id)  # its row's store
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
