"""Starting a woken job in the statement that claims it.

A job woken for a concurrency slot used to cost two writes on the
critical path of every hand-over: the waker's claim (parked to queued)
and then the woken attempt's start (queued to running), each a commit.
When the slot is all the job waits for, the waker's claim marks the row
running at once, as the attempt's start would (attempts, fencing token,
lease, the unique hold released where the lock type says so), and the
worker thread that picks the message up uses that row instead of
writing its own start.

Only where nothing else can still hold the job back once it has its
slot: an actor without an execution lock (``ExecutionLocks`` could park
it again, and a running row cannot be parked), a row whose message
brought no unique options of its own (the claim checks the stored
options), and a woken message this very process delivers and picks up
soon after (ConcurrencySlots trusts only such a reservation).  Anything
else takes the ordinary start, which also works on a row the claim
already marked running: it counts a second attempt and draws a newer
fencing token, so a late pick-up never runs under a stale token.

If the delivery fails after such a claim (Redis down), the row is not
put back in the queue as a plain claim is: it is a started attempt whose
worker never ran it, like one whose worker died, and the re-drive finds
it when its lease has run out and its message is missing.

A started row is used by the woken message's pick-up in this process
(ConcurrencySlots): at once if it comes soon; if it comes late, only once
a write fenced by the start's token (its lease renewed) shows that no
other attempt took the job over meanwhile.  So the claim's token is only
ever the one attempt's.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import TYPE_CHECKING, Optional

from dramatiq_unique import options as opt

if TYPE_CHECKING:
    from dramatiq_unique.storage.models import JobModel
    from dramatiq_unique.suite import ActorConfig

#: Seconds a started row waits here for its message to be picked up before it is dropped
#: (the pick-up then writes an ordinary start).
KEEP_FOR = 60.0


@dataclasses.dataclass(frozen=True)
class StartSpec:
    """How a woken job of an actor is started by its claim."""

    #: The attempt's lease (``unique_ttl``), ms.
    lease_ms: float
    #: Whether the start releases the row's unique hold (``until_executing`` and the like).
    release_hold: bool


def spec_for(config: "ActorConfig") -> Optional[StartSpec]:
    """The actor's start-at-claim spec, or None if its woken jobs must start the ordinary way."""
    options = config.options
    unique = options.get("unique_args") is not None
    lock = options.get("unique_lock") or opt.DEFAULT_UNIQUE_LOCK
    if unique and lock in opt.EXECUTION_LOCKS:
        return None  # it may still wait for its execution lock once it has the slot
    lease = options.get("unique_ttl")
    return StartSpec(
        lease_ms=float(opt.DEFAULT_UNIQUE_TTL if lease is None else lease),
        release_hold=unique and lock in opt.RELEASED_AT_START,
    )


class Started:
    """Rows started by their claim in this process, until their message is picked up."""

    def __init__(self) -> None:
        self._rows: dict[str, tuple[float, "JobModel"]] = {}
        self._lock = threading.Lock()

    def put(self, row: "JobModel") -> None:
        now = time.monotonic()
        with self._lock:
            if len(self._rows) > 1000:  # picked up elsewhere or never: do not keep them forever
                self._rows = {k: v for k, v in self._rows.items() if now - v[0] < KEEP_FOR}
            self._rows[row.message_id] = (now, row)

    def take(self, message_id: str, revision: int) -> "Optional[JobModel]":
        """The row started for this message's delivery, once; None if there is none (or it is stale)."""
        with self._lock:
            entry = self._rows.pop(message_id, None)
        if entry is None or time.monotonic() - entry[0] > KEEP_FOR or entry[1].revision != revision:
            return None
        return entry[1]
