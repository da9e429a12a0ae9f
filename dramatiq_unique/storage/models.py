"""The job record: :class:`JobModel`, :class:`JobStatus`, and the suite's other tables (times naive UTC)."""

from __future__ import annotations

import enum
import json
from datetime import datetime, timedelta, timezone
from typing import Any, Optional, TypeVar, cast

import peewee as pw

from dramatiq_unique.storage import queries

M = TypeVar("M", bound=pw.Model)

#: Longest ``last_error`` text kept, in characters.
MAX_ERROR_LENGTH = 8_000

#: JSON as the job tables store it, by the stock encoder named explicitly: importing pottery patches json.dumps.
dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


class JobStatus(str, enum.Enum):
    """Where a job stands.  A ``str`` enum, so ``job.status == "queued"`` holds."""

    PENDING = "pending"
    QUEUED = "queued"
    RUNNING = "running"
    RETRYING = "retrying"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    #: Cancelled while it waited (:func:`dramatiq_unique.cancel_job`): never ran, not in the dead set.
    CANCELLED = "cancelled"

    def __str__(self) -> str:
        return self.value


#: States in which a job still waits for an attempt.
WAITING = (JobStatus.PENDING.value, JobStatus.QUEUED.value, JobStatus.RETRYING.value)
#: States a job never leaves (but :func:`dramatiq_unique.retry_job` sends a failed one again); keep the
#: order: jobs.py passes FINISHED[0] and [1] to queries.sql as %(succeeded)s and %(failed)s.
FINISHED = (JobStatus.SUCCEEDED.value, JobStatus.FAILED.value, JobStatus.CANCELLED.value)


def utcnow() -> datetime:
    return datetime.now(timezone.utc).replace(tzinfo=None)


def after_ms(ms: Optional[float], start: Optional[datetime] = None) -> datetime:
    return (start or utcnow()) + timedelta(milliseconds=ms or 0)


class JSONField(pw.TextField):
    """JSON stored as text, so one schema serves SQLite and PostgreSQL."""

    def db_value(self, value: Any) -> Optional[str]:
        return None if value is None else dumps(value)

    def python_value(self, value: Any) -> Any:
        return None if value is None else json.loads(value)


class StatusField(pw.CharField):
    def python_value(self, value: Any) -> Any:
        return None if value is None else JobStatus(value)

    def db_value(self, value: Any) -> Any:
        return None if value is None else str(value)  # a JobStatus's str() is its value


def _status_in(*statuses: str) -> str:
    listed = "', '".join(statuses)
    return f"\"status\" IN ('{listed}')"


#: The job table's partial indexes (schema versions 4 and 5), by their columns: a start or an outcome writes
#: to 3 of the 9 indexes (4 of a unique job's), and a lease's renewal can be a HOT update
#: (docs/discussions/how-it-is-built.md, "Storage").  On SQLite those whose predicate reads the status stay
#: whole: its planner takes a partial index only for a query that repeats the predicate's terms (a status IN
#: never is).
PARTIAL_INDEXES = {
    ("unique_key",): '"unique_key" IS NOT NULL',
    ("app", "unique_hold"): '"unique_hold" IS NOT NULL',
    ("app", "actor_name"): '"app" = \'\'',
    ("app", "status", "process_after"): _status_in(*WAITING, JobStatus.RUNNING.value),
    ("app", "finished_at"): '"finished_at" IS NOT NULL',
    ("app", "status", "finished_at"): _status_in(JobStatus.FAILED.value, JobStatus.CANCELLED.value),
    ("app", "idempotency_hold"): '"idempotency_hold" IS NOT NULL',
    ("app", "parked_on", "created_at"): '"parked_on" IS NOT NULL',
}


#: Partial indexes named apart from the whole index of their columns that they replace, by their columns:
#: the name's suffix.  Both stand together while processes of the earlier release run, whose statements name
#: the whole one (``ON CONFLICT`` infers no partial index); ``migrate --contract`` drops it afterwards.
RENAMED_INDEXES = {("app", "unique_hold"): "partial"}


class JobMetadata(pw.Metadata):
    """Peewee's metadata, with the indexes of :data:`PARTIAL_INDEXES` partial (a subclass inherits it)."""

    def fields_to_index(self) -> list:
        made = []
        for index in super().fields_to_index():
            columns = tuple(field.column_name for field in index._expressions)
            where = PARTIAL_INDEXES.get(columns)
            if where is not None and '"status"' in where and not isinstance(self.database, pw.PostgresqlDatabase):
                where = None
            if where is not None:
                index = index.where(pw.SQL(where))
                if columns in RENAMED_INDEXES:
                    index._name = f"{index._name}_{RENAMED_INDEXES[columns]}"
            made.append(index)
        return made


class JobModel(pw.Model):
    """A job's durable record.  Subclass it for an actor's own table (``job_model=``)."""

    id = pw.BigAutoField()
    #: The app the job belongs to: the ``key_prefix`` of the suite that sent it (durable/scope.py).
    app = pw.CharField(max_length=255, default="", constraints=[pw.SQL("DEFAULT ''")])
    message_id = pw.CharField(max_length=64, unique=True)
    actor_name = pw.CharField(max_length=255)
    queue_name = pw.CharField(max_length=255)
    args = JSONField(default=list)
    kwargs = JSONField(default=dict)
    #: The message's options, so the re-drive can rebuild the message.
    options = JSONField(default=dict)
    unique_key = pw.CharField(max_length=300, null=True, index=True)
    #: The unique key while the job holds queue-level uniqueness (NULL otherwise): unique per app.
    unique_hold = pw.CharField(max_length=300, null=True)
    status = StatusField(max_length=16, default=JobStatus.QUEUED.value)
    attempts = pw.IntegerField(default=0)
    #: Bumped when ``unique_on_conflict="replace"`` rewrites a waiting job.
    revision = pw.IntegerField(default=0)
    created_at = pw.DateTimeField(default=utcnow)
    enqueued_at = pw.DateTimeField(null=True)
    process_after = pw.DateTimeField(null=True)
    started_at = pw.DateTimeField(null=True)
    finished_at = pw.DateTimeField(null=True)
    #: While running: when the current attempt's lease runs out.
    lease_until = pw.DateTimeField(null=True)
    last_error = pw.TextField(null=True)
    result = JSONField(null=True)
    idempotency_key = pw.CharField(max_length=255, null=True)
    owner = pw.CharField(max_length=255, null=True)
    idempotency_hold = pw.CharField(max_length=300, null=True)
    fencing_token = pw.BigIntegerField(default=0)
    #: Finished steps of the job, in order: {step name: stored result} (checkpoint()).
    checkpoints = JSONField(null=True)
    #: host:pid:thread of the worker running the current attempt.
    worker = pw.CharField(max_length=255, null=True)
    #: The lock or slot group a pending job is parked on; NULL otherwise.
    parked_on = pw.CharField(max_length=300, null=True)  # indexed with app: see Meta.indexes
    #: The broker's own id of the job's last published message (``redis_message_id``), for the re-drive.
    broker_ref = pw.CharField(max_length=64, null=True)
    #: When the re-drive last found the job's message in the broker.
    checked_at = pw.DateTimeField(null=True)
    #: When the re-drive first missed the job's message; a later miss confirms it lost.
    missing_since = pw.DateTimeField(null=True)
    #: The finished attempts, oldest first, the last few kept (schema version 2).
    history = JSONField(null=True)
    #: When the job was first parked in its current wait, and its ``attempts`` then (schema version 3).
    parked_at = pw.DateTimeField(null=True)
    parked_attempt = pw.IntegerField(null=True)

    class Meta:
        table_name = "dramatiq_unique_jobs"
        model_metadata_class = JobMetadata
        # Each starts with app: a pass and a waker read their own app's rows; holds are unique per app.
        indexes = (
            (("app", "status", "process_after"), False),
            (("app", "finished_at"), False),
            # The dead set, and a listing's failed or cancelled rows, by status (the one above has none).
            (("app", "status", "finished_at"), False),
            (("app", "unique_hold"), True),
            (("app", "idempotency_hold"), True),
            # With created_at: a group's queue head is read in order, and the scan stops at the first due one.
            (("app", "parked_on", "created_at"), False),
            # The rows of no app (written before rows had one) that a pass adopts: none once they are adopted.
            (("app", "actor_name"), False),
        )

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.id} {self.actor_name} {self.status} {self.message_id}>"


class LimitModel(pw.Model):
    """A concurrency limit set at run time (:func:`dramatiq_unique.set_concurrency_limit`), kept in the
    primary store so that it survives Redis losing its copy: one row per app, actor and slot group."""

    #: This table's schema version (storage/schema.py; the job tables have their own).
    dramatiq_unique_version = 1

    id = pw.BigAutoField()
    app = pw.CharField(max_length=255)
    actor_name = pw.CharField(max_length=255)
    #: The slot group's key (``<actor>:<digest>``), or '' for the actor's own override.
    group_key = pw.CharField(max_length=300, default="")
    concurrency_limit = pw.IntegerField()
    #: The key in words (``customer=42``); NULL for the actor's own override, or when not known.
    words = pw.TextField(null=True)
    #: The key as ``set_concurrency_limit`` took it (JSON), NULL when not known.
    key = JSONField(null=True)
    set_at = pw.DateTimeField(default=utcnow)

    class Meta:
        table_name = "dramatiq_unique_limits"
        indexes = ((("app", "actor_name", "group_key"), True),)


def bound_copy(model: type[M], db: pw.Database, name: str) -> type[M]:
    """``model`` bound to ``db``: a subclass with the same table (peewee binds a model class to one Database)."""
    meta = model._meta
    # table_name is not inherited by a subclass: named, as the schema and the database.
    attrs = {"database": db, "table_name": meta.table_name, "schema": meta.schema}
    return cast(Any, type(model))(name, (model,), {
        "Meta": type("Meta", (), attrs), "__module__": model.__module__, "__doc__": model.__doc__,
    })


def bound_limits(db: pw.Database) -> type[LimitModel]:
    """:class:`LimitModel` bound to ``db``: a subclass, so two suites of one process each have their own."""
    made = bound_copy(LimitModel, db, "LimitModel")
    made._meta.name = LimitModel._meta.name  # peewee names indexes after it: the same names in every copy
    return made


class FenceModel(pw.Model):
    """The newest fencing token handed out for each unique key: kept in the job database, which the
    tokens guard, so that no Redis flush or fail-over hands out a smaller one again."""

    key = pw.CharField(max_length=300, primary_key=True)
    token = pw.BigIntegerField(default=0)

    class Meta:
        table_name = queries.FENCES


def create_fence_table(db: pw.Database) -> None:
    with db.bind_ctx([FenceModel], bind_refs=False, bind_backrefs=False):
        db.create_tables([FenceModel], safe=True)
