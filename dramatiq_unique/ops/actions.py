"""What an operator does, on the suite named (not the process's current one): the dead set, a limit
in words, pruning, and the bulk actions on a selection made from words (``retry`` takes the
dead set, ``cancel`` waiting jobs; one UPDATE per job table and store)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Optional, Union

import dramatiq

from dramatiq_unique.durable import bulk_actions
from dramatiq_unique.durable.bulk_actions import CANCEL, RETRY, Selection
from dramatiq_unique.durable.dead import dead_jobs
from dramatiq_unique.durable.redrive import MAX_PAGES
from dramatiq_unique.durable.redrive import prune as prune_rows
from dramatiq_unique.durable.scope import Scope
from dramatiq_unique.guard import guarded
from dramatiq_unique.ops import keys
from dramatiq_unique.ops.listing import job_row, parse_statuses
from dramatiq_unique.ops.views import JobRow
from dramatiq_unique.ops.words import when
from dramatiq_unique.slots import limits
from dramatiq_unique.storage.models import WAITING
from dramatiq_unique.suite import Suite

#: What each bulk action runs, given the suite, the broker whose actors it may touch, and the selection.
BULK = {RETRY: bulk_actions.retry_all, CANCEL: bulk_actions.cancel_all}
#: Characters of an error text to look for, at most.
MAX_ERROR_TEXT = 200


def dead(
    suite: "Suite", *, actor: Optional[str] = None, since: Union[datetime, timedelta, None] = None, limit: int = 100,
) -> list[JobRow]:
    """The dead set (:func:`dramatiq_unique.dead_jobs`), the last to fail first, as list rows."""
    rows = dead_jobs(actor, since, limit, suite=suite)
    return [job_row(suite, job, suite.stores.index_of(type(job))) for job in rows]


def limit_value(text: str, most: int = limits.MAX_LIMIT) -> Optional[int]:
    """An operator's limit: ``N`` (a whole number from 0 to ``most``), ``halt`` (0) or ``default`` (None: the
    declared limit); ValueError for anything else.  ASCII digits only: ``"\\u0660"`` is a digit to ``int()``."""
    word = text.strip().lower()
    if word in ("halt", "default"):
        return 0 if word == "halt" else None
    if word.isascii() and word.isdigit() and len(word) <= len(str(most)) and int(word) <= most:
        return int(word)
    raise ValueError(f"a limit is a whole number from 0 to {most}, 'halt' or 'default', not {text[:40]!r}")


def prune(suite: "Suite", broker: "dramatiq.Broker") -> int:
    """Delete the finished rows past ``retention`` now, as a re-drive pass does (this app's rows of the
    actors ``broker``'s process declares); returns how many."""
    scope = Scope(suite, broker)
    pruned = 0
    with guarded("pruning"):
        for index in range(len(suite.stores)):
            for base in scope.models():
                model = suite.stores.model_in(base, index)
                pruned += prune_rows(model, scope.prunable(model), suite.settings,
                                     page=suite.settings.redrive_page_size, max_pages=MAX_PAGES)
    return pruned


def selection(
    suite: "Suite", action: str, *, actor: Optional[str] = None, key: Optional[str] = None,
    since: Optional[datetime] = None, error: Optional[str] = None, status: Optional[str] = None,
) -> Selection:
    """The rows ``action`` takes, from an operator's words; ValueError for words that select nothing
    a statement can find (an actor not declared, a key not made of its unique_args, a bad status)."""
    if action not in BULK:
        raise ValueError(f"no bulk action {action!r}: {' or '.join(BULK)}")
    actor, key, error = ((text or "").strip() or None for text in (actor, key, error))
    if actor is not None and suite.actor_config(actor) is None:
        raise ValueError(f"no tracked actor {actor!r} is declared in the app")
    unique_keys = None
    if key is not None:
        unique_keys = keys.derived(suite, actor, key)
        if unique_keys is None:
            raise ValueError(f"a bulk action finds its jobs by their unique key: {key!r} must name the parameters "
                             f"that unique_args selects (customer=42){'' if actor else ', with the actor given'}")
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


def described(action: str, sel: Selection, key: Optional[str] = None) -> str:
    """The selection in words, for a question or an answer: ``dead jobs of charge failed since …``."""
    what = "dead jobs" if action == RETRY else (
        "waiting jobs" if set(sel.statuses) == set(WAITING) else f"{'/'.join(sel.statuses)} jobs")
    parts = [what, sel.actor and f"of {sel.actor}", key and f"with the key {key!r}",
             sel.error and f"whose error holds {sel.error!r}",
             sel.since and f"{'failed' if action == RETRY else 'created'} since {when(sel.since)} UTC"]
    return " ".join(part for part in parts if part)
