"""Multi-step jobs whose finished steps a retry does not redo: each step's result is stored on the job
row in one write fenced by the attempt's token (docs/howto/checkpoints.md)."""

from __future__ import annotations

import json
from typing import Any, Callable, TypeVar

from dramatiq_unique.context import require
from dramatiq_unique.errors import LockLost, NotSerializable
from dramatiq_unique.guard import guarded
from dramatiq_unique.observe import events
from dramatiq_unique.storage import jobs
from dramatiq_unique.storage.models import dumps

T = TypeVar("T")


def step_key(name: str) -> str:
    """A key for step ``name`` of the current job, the same on every attempt."""
    job = require().job
    return f"{job.message_id}:{name}"  # type: ignore[union-attr]


def checkpoint(name: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run ``fn(*args, **kwargs)`` once per job; on a retry return its stored result.

    The result must be JSON-serialisable; what is returned is its JSON
    form, the same on the first attempt and on retries (a tuple comes back
    as a list).  Raises :class:`NotSerializable` before the step is
    recorded as done, :class:`LockLost` if a newer attempt owns the job, and
    :class:`DatabaseUnavailable` if the step cannot be checked or recorded.
    """
    job = require().job
    assert job is not None
    done = dict(job.checkpoints or {})
    if name in done:
        return done[name]
    model = type(job)
    with guarded(f"checking the fence of job {job.message_id}"):  # a zombie should not even start the step
        token = model.select(model.fencing_token).where(model.id == job.id).scalar()
    if token != job.fencing_token:
        raise events.lock_lost(job, LockLost(f"job {job.message_id} was started again by a newer attempt"))
    result = fn(*args, **kwargs)
    try:
        stored = json.loads(dumps(result))
    except (TypeError, ValueError) as e:
        raise NotSerializable(f"step {name!r} of {job.actor_name} returned a {type(result).__name__}") from e
    done[name] = stored
    with guarded(f"recording step {name!r} of job {job.message_id}"):
        recorded = jobs.update_fenced(model, job.id, job.fencing_token, {"checkpoints": done})
    if not recorded:
        events.fenced_out(job, "checkpoint")
        raise LockLost(f"job {job.message_id} was started again by a newer attempt; step {name!r} not recorded")
    job.checkpoints = done
    return stored
