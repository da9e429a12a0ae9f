"""Bulk actions as an operator asks for them: a selection from words, its count (what a confirmation
shows), then the action (:mod:`dramatiq_unique.durable.bulk_actions`, one UPDATE per job table and store).

    selection(suite, action, *, actor=None, key=None, since=None, error=None, status=None) -> Selection
    preview(suite, broker, action, selection) -> Outcome
    act(suite, broker, action, selection) -> Outcome

``action`` is ``"retry"`` (the dead set) or ``"cancel"`` (waiting jobs).
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Optional

from dramatiq_unique.durable import bulk_actions
from dramatiq_unique.durable.bulk_actions import CANCEL, RETRY, Outcome, Selection
from dramatiq_unique.ops import keyfilter
from dramatiq_unique.ops.listing import parse_statuses
from dramatiq_unique.storage.models import WAITING

if TYPE_CHECKING:
    import dramatiq

    from dramatiq_unique.suite import Suite

ACTIONS = (RETRY, CANCEL)
#: Characters of an error text to look for, at most.
MAX_ERROR_TEXT = 200


def selection(
    suite: "Suite", action: str, *, actor: Optional[str] = None, key: Optional[str] = None,
    since: Optional[datetime] = None, error: Optional[str] = None, status: Optional[str] = None,
) -> Selection:
    """The rows ``action`` takes, from an operator's words; ValueError for words that select nothing
    a statement can find (an actor not declared, a key not made of its unique_args, a status it
    cannot take)."""
    if action not in ACTIONS:
        raise ValueError(f"no bulk action {action!r}: {' or '.join(ACTIONS)}")
    actor = (actor or "").strip() or None
    if actor is not None and suite.actor_config(actor) is None:
        raise ValueError(f"no tracked actor {actor!r} is declared in the app")
    unique_keys = None
    key = (key or "").strip() or None
    if key is not None:
        unique_keys = keyfilter.derived(suite, actor, key)
        if unique_keys is None:
            raise ValueError(f"a bulk action finds its jobs by their unique key: {key!r} must name the parameters "
                             f"that unique_args selects (customer=42){'' if actor else ', with the actor given'}")
    error = (error or "").strip() or None
    if error is not None and (action != RETRY or len(error) > MAX_ERROR_TEXT):
        raise ValueError(f"an error text selects dead jobs, up to {MAX_ERROR_TEXT} characters")
    statuses: tuple[str, ...] = WAITING
    if status:
        if action != CANCEL:
            raise ValueError("the dead set is the failed jobs: a status selects waiting jobs to cancel")
        statuses = parse_statuses(status)
        outside = [s for s in statuses if s not in WAITING]
        if outside:
            raise ValueError(f"only waiting jobs can be cancelled ({', '.join(WAITING)}), not {', '.join(outside)}")
    return Selection(actor=actor, unique_keys=unique_keys, since=since, error=error, statuses=statuses)


def preview(suite: "Suite", broker: "Optional[dramatiq.Broker]", action: str, sel: Selection) -> Outcome:
    """How many jobs ``action`` would take now (and leave: of actors not declared here)."""
    return bulk_actions.preview(suite, broker or suite.broker, action, sel)


def act(suite: "Suite", broker: "Optional[dramatiq.Broker]", action: str, sel: Selection) -> Outcome:
    """Retry or cancel the jobs ``sel`` selects."""
    run = bulk_actions.retry_all if action == RETRY else bulk_actions.cancel_all
    return run(suite, broker or suite.broker, sel)


def described(action: str, sel: Selection, key: Optional[str] = None) -> str:
    """The selection in words, for a question or an answer: ``dead jobs of charge failed since …``."""
    what = "dead jobs" if action == RETRY else (
        "waiting jobs" if set(sel.statuses) == set(WAITING) else f"{'/'.join(sel.statuses)} jobs")
    parts = [what]
    if sel.actor:
        parts.append(f"of {sel.actor}")
    if key:
        parts.append(f"with the key {key!r}")
    if sel.error:
        parts.append(f"whose error holds {sel.error!r}")
    if sel.since is not None:
        parts.append(f"{'failed' if action == RETRY else 'created'} since "
                     f"{sel.since.replace(microsecond=0).isoformat(sep=' ')} UTC")
    return " ".join(parts)
