"""What the pages read, from the ops layer, and the two things it does not give.

The ops layer (:mod:`dramatiq_unique.ops`) reads the stores and Redis for the
command line and for these pages alike.  Kept here: the attempts timeline's
layout; which level a slot group's form names (the page shows a key's words,
and posts the group's key with them).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Generic, Optional, TypeVar

from dramatiq_unique import ops
from dramatiq_unique.errors import InvalidOption, JobNotFound
from dramatiq_unique.ops import keys
from dramatiq_unique.parking.groups import whole_actor
from dramatiq_unique.slots.limits import key_group, key_words
from dramatiq_unique.storage.models import utcnow

if TYPE_CHECKING:
    from dramatiq_unique.ops.views import JobView, LockView, OverrideView, Page, SlotGroupView, Stats
    from dramatiq_unique.suite import Suite

T = TypeVar("T")

#: Width of the attempts timeline, px; attempts beyond the last :data:`MAX_ATTEMPTS` are not drawn.
TIMELINE_WIDTH, MAX_ATTEMPTS = 600, 50


@dataclass
class Listing(Generic[T]):
    items: list[T]
    down: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Span:
    """One attempt drawn on the timeline."""

    attempt: int
    x: float
    width: float
    y: int
    css: str
    label: str


def stats(suite: "Suite", minutes: int) -> "Stats":
    return ops.stats(suite, minutes=minutes)


def jobs(suite: "Suite", **filters: Any) -> "Page":
    """A page of the jobs list (ValueError for a bad filter or cursor)."""
    return ops.jobs(suite, **filters)


def job(suite: "Suite", ref: str) -> "Optional[JobView]":
    """One job by id or message id; None when there is none (or ``ref`` cannot be an id)."""
    try:
        return ops.job(suite, ref)
    except (JobNotFound, ValueError):
        return None


def locks(suite: "Suite") -> "Listing[LockView]":
    return Listing(ops.locks(suite))


def slot_groups(suite: "Suite") -> "Listing[SlotGroupView]":
    return Listing(ops.slots(suite))


def _time(value: Any) -> Optional[datetime]:
    """A time of an attempt: a datetime, or ISO text (a ``history`` column is JSON)."""
    if isinstance(value, datetime):
        return value
    if isinstance(value, str):
        try:
            return datetime.fromisoformat(value)
        except ValueError:
            return None
    return None


def timeline(job: "JobView", now: Optional[datetime] = None) -> list[Span]:
    """The job's attempts laid out on one time axis, from its creation to its end (or now): for
    each, the time it waited (``a-wait``) and the time it ran (coloured by its outcome)."""
    timed = [(a, _time(a.started_at), _time(a.finished_at)) for a in job.history]
    attempts = [(a, began, ended) for a, began, ended in timed if began is not None][-MAX_ATTEMPTS:]
    if not attempts:
        return []
    start = min(job.created_at or attempts[0][1], attempts[0][1])
    ends = [ended for _, _, ended in attempts if ended is not None]
    open_end = now or utcnow()
    end = max([*ends, job.finished_at or start, *([open_end] if len(ends) < len(attempts) else [])])
    total = max((end - start).total_seconds(), 0.001)
    spans = []
    waited_from = start
    for row, (attempt, began, ended) in enumerate(attempts):
        # What the attempt waited for (since the job was created, or since the attempt before ended).
        waited = max((began - waited_from).total_seconds(), 0.0)
        if waited > 0:
            spans.append(Span(attempt.attempt, round(TIMELINE_WIDTH * (waited_from - start).total_seconds() / total, 1),
                              round(max(TIMELINE_WIDTH * waited / total, 1.0), 1), row * 18, "a-wait",
                              f"attempt {attempt.attempt}: waited {waited * 1000:.0f} ms"))
        waited_from = ended or end
        length = max(((ended or end) - began).total_seconds(), 0.0)
        status = attempt.status or "other"
        css = "a-" + (status if status in ("succeeded", "failed", "retrying", "running") else "other")
        label = f"attempt {attempt.attempt}: {status}, {length * 1000:.0f} ms"
        spans.append(Span(attempt.attempt, round(TIMELINE_WIDTH * (began - start).total_seconds() / total, 1),
                          round(max(TIMELINE_WIDTH * length / total, 2.0), 1), row * 18, css, label))
    return spans


def limits(suite: "Suite") -> "list[OverrideView]":
    return ops.limits(suite)


def slot_target(suite: "Suite", actor: str, words: str, group: str) -> "keys.Target":
    """The level a slots form names: ``group``, the group's key as the page listed it (``<actor>:<digest>``;
    '' for the actor's own limit), which settles what the words cannot (whether 42 was sent as an int or a
    str, a group whose words are not known).  ``words``, the key as the page showed it (``customer=42``,
    a ``#hash``, ``(all)``), must name that group: a form of another row, or a forged one, is refused.
    Without ``group``, the words alone (as ``limit`` on the command line reads them)."""
    config = suite.actor_config(actor)
    if config is None:
        raise InvalidOption(f"no actor {actor!r} is declared in this process")
    words, group = words.strip(), group.strip()
    if not group:
        return ops.limit_target(suite, config, words)
    if group not in keys.named_groups(suite, config, words):
        raise InvalidOption(f"no slot group of {actor!r} has the key {words!r}")
    if group == whole_actor(actor) and config.options.get("concurrency_key") is None:
        return keys.Target("")  # the actor's own limit
    for value in ([] if words.startswith("#") else keys.candidates(config, words)):
        if key_group(config, value) == group:
            return keys.Target(group, key_words(config, value), value)
    return keys.Target(group)  # named by its hash: the words kept with its limit stay
