"""Reading this app's jobs in every job table of every store: one home for :func:`get_job`, the
dead set and the operator's commands.

With several stores (:mod:`dramatiq_unique.storage.stores`), a store that does not answer is
skipped and remembered down, as the sends and the re-drive remember it; what the others hold
is still read.  With one store, its failure is the caller's :class:`DatabaseUnavailable`.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Callable, Optional, TypeVar, Union

from dramatiq_unique.durable.scope import NO_APP
from dramatiq_unique.errors import DatabaseUnavailable
from dramatiq_unique.storage import jobs
from dramatiq_unique.storage.models import JobModel

if TYPE_CHECKING:
    from dramatiq_unique.suite import Suite

logger = logging.getLogger(__name__)

T = TypeVar("T")


def ours(suite: "Suite", job: Optional[JobModel]) -> Optional[JobModel]:
    """``job`` if it is this suite's app's (or was written before rows had an app), else None."""
    return job if job is not None and job.app in (suite.app, NO_APP) else None


def each_store(
    suite: "Suite", what: str, read: Callable[[int, list[type[JobModel]]], T], *,
    indexes: Optional[list[int]] = None,
) -> tuple[list[T], list[DatabaseUnavailable]]:
    """``read(index, tables)`` for every store (or ``indexes``), the primary first, with that store's
    job tables; returns what each answered, and the errors of the stores that did not."""
    stores = suite.stores
    answers: list[T] = []
    down: list[DatabaseUnavailable] = []
    for index in range(len(stores)) if indexes is None else indexes:
        if stores.several and stores.is_down(index):  # a send or a pass just found it down: not asked again
            down.append(DatabaseUnavailable(f"{what}: {stores.name(index)} is down"))
            continue
        try:
            with jobs.db_errors(f"{what} in {stores.name(index)}" if stores.several else what):
                for model in suite.models if stores.several else ():
                    stores.ensure(model, index)  # a store down at set-up gets its tables now
                answers.append(read(index, [stores.model_in(model, index) for model in suite.models]))
        except DatabaseUnavailable as e:
            if not stores.several:
                raise
            stores.mark_down(index, e, quiet=True)
            down.append(e)
    return answers, down


def find_job(
    suite: "Suite", id_or_message_id: Union[int, str], *, model: Optional[type[JobModel]] = None,
    store: Optional[int] = None,
) -> Optional[JobModel]:
    """A job of this app by message id (any table, any store, or ``store``) or numeric id (``model``,
    the shared table by default, in the primary or ``store``); None if there is none.

    A job found in no store that answered, while one did not, raises ``DatabaseUnavailable``:
    it may be in that store.
    """
    numeric = isinstance(id_or_message_id, int) or str(id_or_message_id).isdigit()
    indexes = [store or 0] if numeric or store is not None else None

    def read(index: int, tables: list[type[JobModel]]) -> Optional[JobModel]:
        table = None if model is None else suite.stores.model_in(model, index)
        return ours(suite, jobs.find_job(tables, id_or_message_id, table))

    down: list[DatabaseUnavailable] = []
    for index in range(len(suite.stores)) if indexes is None else indexes:
        # Store by store, stopping at the first that has it: a job of the primary is found
        # without asking (or waiting for) a secondary.
        found, failed = each_store(suite, f"reading job {id_or_message_id}", read, indexes=[index])
        if found and found[0] is not None:
            return found[0]
        down += failed
    if down:
        raise down[0]
    return None


def select_all(suite: "Suite", what: str, query: Callable[[type[JobModel]], Any]) -> list[JobModel]:
    """The rows ``query(table)`` selects in every job table of every store that answers (a store
    that does not is named in a WARNING: the answer lacks its rows)."""
    found, down = each_store(suite, what, lambda _, tables: [row for table in tables for row in query(table)])
    for error in down:
        logger.warning("%s; its rows are left out.", error)
    return [row for rows in found for row in rows]
