"""The operator's actions and the dead set: the suite's own functions, called for a given suite.

``dead_jobs``, ``retry_job``, ``cancel_job`` (:mod:`dramatiq_unique.durable`) and
``set_concurrency_limit``/``concurrency_status`` (:mod:`dramatiq_unique.slots.limits`)
are given ``suite``: the command line and the dashboard name the suite they act on,
and the process's current suite (the last ``setup()``) stays as it was.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Optional, Union

from dramatiq_unique.durable import claims
from dramatiq_unique.durable.cancel import cancel_job
from dramatiq_unique.durable.dead import dead_jobs, retry_job
from dramatiq_unique.durable.redrive import MAX_PAGES
from dramatiq_unique.durable.scope import Scope
from dramatiq_unique.guard import guarded
from dramatiq_unique.ops.listing import job_row
from dramatiq_unique.ops.views import JobRow
from dramatiq_unique.slots import limits
from dramatiq_unique.slots.limits import ConcurrencyStatus, concurrency_status, set_concurrency_limit
from dramatiq_unique.storage.models import JobModel

if TYPE_CHECKING:
    import dramatiq

    from dramatiq_unique.suite import Suite


def dead(
    suite: "Suite", *, actor: Optional[str] = None, since: Union[datetime, timedelta, None] = None, limit: int = 100,
) -> list[JobRow]:
    """The dead set (:func:`dramatiq_unique.dead_jobs`), the last to fail first, as list rows."""
    rows = dead_jobs(actor, since, limit, suite=suite)
    return [job_row(suite, job, suite.stores.index_of(type(job))) for job in rows]


def retry(suite: "Suite", id_or_message_id: Union[int, str]) -> JobModel:
    """:func:`dramatiq_unique.retry_job` of the job an operator named (JobNotFound, AmbiguousJobId,
    JobStateError, DuplicateJob): a number names a job only if one store has it, as for the function."""
    return retry_job(id_or_message_id, suite=suite)


def cancel(suite: "Suite", id_or_message_id: Union[int, str]) -> JobModel:
    """:func:`dramatiq_unique.cancel_job` of the job an operator named (JobNotFound, AmbiguousJobId,
    JobStateError)."""
    return cancel_job(id_or_message_id, suite=suite)


def set_limit(suite: "Suite", actor: str, limit: Optional[int], key: Any = None) -> ConcurrencyStatus:
    """:func:`dramatiq_unique.set_concurrency_limit` (``0`` halts, None restores the default),
    then the group's :func:`~dramatiq_unique.concurrency_status`."""
    set_concurrency_limit(actor, limit, key, suite=suite)
    return concurrency_status(actor, key, suite=suite)


def limit_status(suite: "Suite", actor: str, key: Any = None) -> ConcurrencyStatus:
    return concurrency_status(actor, key, suite=suite)


def set_group_limit(
    suite: "Suite", actor: str, group: str, limit: Optional[int], *, words: Optional[str] = None, key: Any = None,
) -> ConcurrencyStatus:
    """The limit of a level named by its group key ('' for the actor's own; see
    :func:`~dramatiq_unique.ops.limitkeys.resolve`), then its status."""
    limits.set_group_limit(actor, group, limit, suite=suite, words=words, key=key)
    return limits.group_status(actor, group, suite=suite)


def prune(suite: "Suite", broker: "dramatiq.Broker") -> int:
    """Delete the finished rows past ``retention`` now, as a re-drive pass does (the same
    step, the same scope: this app's rows of the actors ``broker``'s process declares);
    returns how many."""
    scope = Scope(suite, broker)
    pruned = 0
    with guarded("pruning"):
        for index in range(len(suite.stores)):
            for base in scope.models():
                model = suite.stores.model_in(base, index)
                pruned += claims.prune(model, scope.prunable(model), suite.settings,
                                       page=suite.settings.redrive_page_size, max_pages=MAX_PAGES)
    return pruned
