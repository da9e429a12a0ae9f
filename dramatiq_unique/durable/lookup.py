"""Reading this app's jobs in every job table of every store.  With several stores, one that does not
answer is skipped and remembered down; with one, its failure is the caller's :class:`DatabaseUnavailable`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Optional, TypeVar, Union

from dramatiq_unique.durable.scope import NO_APP
from dramatiq_unique.errors import AmbiguousJobId, DatabaseUnavailable, JobNotFound
from dramatiq_unique.guard import guarded
from dramatiq_unique.storage.models import JobModel
from dramatiq_unique.storage.stores import base_of, unreachable

if TYPE_CHECKING:
    from dramatiq_unique.suite import Suite

T = TypeVar("T")


def ours(suite: "Suite", job: Optional[JobModel]) -> Optional[JobModel]:  # this app's, or written before apps
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
            with guarded(f"{what} in {stores.name(index)}" if stores.several else what):
                for model in suite.models if stores.several else ():
                    stores.ensure(model, index)  # a store down at set-up gets its tables now
                answers.append(read(index, [stores.model_in(model, index) for model in suite.models]))
        except DatabaseUnavailable as e:
            if not stores.several:
                raise
            if e.__cause__ is None or unreachable(e.__cause__):  # not a timeout or a deadlock: it answers
                stores.mark_down(index, e, quiet=True)
            down.append(e)
    return answers, down


def find_job(
    suite: "Suite", id_or_message_id: Union[int, str], *, model: Optional[type[JobModel]] = None,
    store: Optional[int] = None,
) -> Optional[JobModel]:
    """A job of this app by message id (any table and store, or ``store``) or numeric id (in ``model``, the
    shared table by default, of the primary or ``store``); None if none.  ``DatabaseUnavailable`` instead of
    None while a store did not answer: it may be there."""
    numeric = isinstance(id_or_message_id, int) or str(id_or_message_id).isdigit()
    indexes = [store or 0] if numeric or store is not None else None

    def read(index: int, tables: list[type[JobModel]]) -> Optional[JobModel]:
        tables = tables if model is None else [suite.stores.model_in(model, index)]
        if numeric:
            return ours(suite, tables[0].get_or_none(id=int(id_or_message_id)))
        return ours(suite, next(filter(None, (t.get_or_none(message_id=str(id_or_message_id)) for t in tables)), None))

    down: list[DatabaseUnavailable] = []
    for index in range(len(suite.stores)) if indexes is None else indexes:
        # Stopping at the first store that has it: a job of the primary is found without waiting for a secondary.
        found, failed = each_store(suite, f"reading job {id_or_message_id}", read, indexes=[index])
        if found and found[0] is not None:
            return found[0]
        down += failed
    if down:
        raise down[0]
    return None


#: Largest job id: a bigger number names no row (and would overflow SQLite's integer).
MAX_JOB_ID = 2**63 - 1


def resolve(
    suite: "Suite", job: Union[int, str, JobModel], *, model: Optional[type[JobModel]] = None,
) -> JobModel:
    """The one job of this app that an action names: its row (read again), its message id, or a numeric id (in
    ``model``) that names a job in exactly one store (:class:`AmbiguousJobId`); :class:`JobNotFound` for none."""
    if isinstance(job, bool) or not isinstance(job, (int, str, JobModel)):
        raise TypeError(f"a job id (int), message id (str) or job row (JobModel), not {type(job).__name__}")
    if isinstance(job, JobModel):
        return _again(suite, job)
    if isinstance(job, str):
        ref = job.strip()
        if not ref or not ref.isprintable():
            raise ValueError(f"not a job id or message id: {job[:64]!r}")
        job = int(ref) if ref.isascii() and ref.isdigit() else ref
    if isinstance(job, str):
        found = find_job(suite, job, model=model)
    else:
        found = _numbered(suite, job, model or suite.models[0]) if 0 <= job <= MAX_JOB_ID else None
    if found is None:
        raise JobNotFound(repr(job))
    return found


def _again(suite: "Suite", row: JobModel) -> JobModel:
    database = type(row)._meta.database
    index = next((i for i, db in enumerate(suite.stores.databases) if db is database), None)
    if index is None or row.id is None:
        where = "an unsaved row" if row.id is None else "a row of none of this suite's job stores"
        raise JobNotFound(f"{row.message_id!r} ({where})")
    found = find_job(suite, row.id, model=base_of(type(row)), store=index)
    if found is None or found.message_id != row.message_id:  # SQLite may give a deleted row's id again
        raise JobNotFound(repr(row.message_id))
    return found


def _numbered(suite: "Suite", number: int, model: type[JobModel]) -> Optional[JobModel]:
    stores = suite.stores

    def read(index: int, _: list[type[JobModel]]) -> Optional[JobModel]:
        return ours(suite, stores.model_in(model, index).get_or_none(id=number))

    answers, down = each_store(suite, f"reading job {number}", read)
    found = [row for row in answers if row is not None]
    if len(found) > 1:
        named = "; ".join(f"{stores.name(stores.index_of(type(row)))}: message id {row.message_id} "
                          f"({row.actor_name}, {row.status})" for row in found)
        raise AmbiguousJobId(f"job {number} is a job in {len(found)} stores ({named}): name the one you mean by "
                             "its message id, or pass its row (from dead_jobs() or get_job())")
    if found and down:
        row = found[0]
        raise DatabaseUnavailable(
            f"job {number} is a job in {stores.name(stores.index_of(type(row)))} (message id {row.message_id}), "
            f"but {'; '.join(str(e) for e in down)}, and may have a job {number} too: name the one you mean "
            "by its message id")
    if down:
        raise down[0]
    return found[0] if found else None
