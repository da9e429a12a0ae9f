"""What an operator sees: plain dataclasses, each with ``as_dict()`` for JSON.  Times are naive UTC
(ISO text in JSON); durations are ms."""

from __future__ import annotations

import dataclasses
import json
from datetime import datetime
from typing import Any, Optional


class View:
    def as_dict(self) -> dict[str, Any]:
        """The view as JSON reads it: times as ISO text, enums as their value."""
        return json.loads(json.dumps(dataclasses.asdict(self), default=lambda value: (  # type: ignore[call-overload]
            value.isoformat() if isinstance(value, datetime) else getattr(value, "value", str(value)))))


@dataclasses.dataclass
class JobRow(View):
    """One line of the jobs list."""

    id: int
    #: What ``job`` takes to open this row: the id for the primary store's shared table, else the message id.
    ref: str
    message_id: str
    actor: str
    queue: str
    status: str
    #: The job's key in words (``customer=42``), or '' when it has none.
    key: str
    attempts: int
    created_at: Optional[datetime]
    started_at: Optional[datetime]
    finished_at: Optional[datetime]
    #: The job table it lives in, and the store (0: the primary).
    table: str
    store: int
    #: The first line of ``last_error`` (``ConnectionError: the ledger did not answer``), or ''.
    error: str = ""


@dataclasses.dataclass
class Page(View):
    """A page of jobs, newest first; ``cursor`` opens the next page (None: this was the last)."""

    rows: list[JobRow]
    cursor: Optional[str]
    #: Stores that did not answer: their rows are missing from this page.
    down: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Attempt(View):
    """One attempt of a job (from the row's ``history`` when it has one, else the last attempt)."""

    attempt: int
    started_at: Optional[datetime]
    finished_at: Optional[datetime]
    status: Optional[str]
    error: Optional[str]
    worker: Optional[str]


@dataclasses.dataclass
class Waiting(View):
    """Why a waiting job waits, as facts; :func:`~dramatiq_unique.ops.words.why` puts them in words."""

    #: "slot", "lock", "halted", "due", "queued", "woken" (queued, with a slot), "retrying", "pending".
    reason: str
    #: The group in words: ``deliver_webhook customer=42``.
    label: str = ""
    limit: Optional[int] = None
    #: Jobs holding the slots or the lock (their ids, as far as the job tables tell), and how many hold.
    holders: list[int] = dataclasses.field(default_factory=list)
    held: int = 0
    #: Jobs of the group waiting ahead of this one (a floor when it says ``ahead_more``).
    ahead: int = 0
    ahead_more: bool = False
    token: Optional[int] = None
    #: ms until the lock's lease runs out.
    left_ms: Optional[float] = None
    #: ms until the job comes due (negative: overdue by that much).
    due_in_ms: Optional[float] = None
    since: Optional[datetime] = None
    #: What could not be learned (a store that did not answer), said after the sentence.
    note: str = ""


@dataclasses.dataclass(kw_only=True)
class JobView(JobRow):
    """One job: its row, attempts, fencing token, checkpoints and, while it waits, why."""

    args: Any
    kwargs: Any
    enqueued_at: Optional[datetime]
    process_after: Optional[datetime]
    last_error: Optional[str]
    result: Any
    fencing_token: int
    checkpoints: Any
    worker: Optional[str]
    parked_on: Optional[str]
    history: list[Attempt]
    waiting: Optional[Waiting]
    #: ``waiting`` in words ('' when the job does not wait).
    why: str
    #: The concurrency slot the job holds (running, or woken and still in the broker), in words, or ''.
    slot: str = ""


@dataclasses.dataclass
class LockView(View):
    """A held lock: ``kind`` "run" (an execution lock) or "queue" (a waiting job's queue lock)."""

    kind: str
    actor: str
    key: str
    unique_key: str
    holder: Optional[int]
    holder_message_id: Optional[str]
    token: Optional[int]
    left_ms: float
    #: Jobs parked on the lock, in the order they start (the first few), and how many wait in all.
    waiters: list[int]
    waiting: int


@dataclasses.dataclass
class SlotGroupView(View):
    """A group of concurrency slots."""

    actor: str
    key: str
    group: str
    #: The limit in force; None: no limit, or not known here (``limit_from`` says which).
    limit: Optional[int]
    held: int
    #: Every holder the job tables name: running jobs, then woken ones waiting in the broker.
    holders: list[int]
    waiters: list[int]
    waiting: int
    halted: bool
    #: Where ``limit`` comes from: "override", "actor override", "message" (the group's last message
    #: brought it), "declared", "none", or "unknown" (declared by an app this process did not import).
    limit_from: str = ""
    #: The holders that were woken with their slot and wait in the broker for a worker thread.
    queued_holders: list[int] = dataclasses.field(default_factory=list)
    #: What the numbers need said (more held than the limit, holders no row names, limits Redis lost).
    note: str = ""


@dataclasses.dataclass
class OverrideView(View):
    """A limit set at run time (``set_concurrency_limit``, ``limit``), as the database keeps it."""

    actor: str
    #: The key in words; "(all)" for the actor's own limit; the group's ``#hash`` when no words are known.
    key: str
    #: The group's key (``<actor>:<digest>``), or '' for the actor's own limit.
    group: str
    limit: int
    set_at: Optional[datetime]


@dataclasses.dataclass
class Stats(View):
    """Counts, throughput and timings of the last ``minutes``."""

    minutes: int
    #: Waiting and running jobs by status (all of them), finished ones of the window.
    by_status: dict[str, int]
    #: {actor: {status: count}}, counted as ``by_status``.
    by_actor: dict[str, dict[str, int]]
    #: Jobs finished per minute, oldest minute first (``minutes`` values).
    throughput: list[int]
    #: {"p50": .., "p95": ..} ms of the jobs finished in the window (waiting: created or due to started).
    waiting_ms: dict[str, Optional[float]]
    running_ms: dict[str, Optional[float]]
    down: list[str] = dataclasses.field(default_factory=list)
    #: Of the jobs whose last attempt was parked for a lock or a slot: from first parked to started.
    parked_ms: dict[str, Optional[float]] = dataclasses.field(default_factory=lambda: {"p50": None, "p95": None})
    #: The jobs the timings are of (the newest finished in the window, bounded), and how many were parked.
    timed: int = 0
    parked: int = 0
