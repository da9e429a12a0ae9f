"""What jobs park on: the gate protocol, and the words parking and gates share.

A gate (an execution lock, a concurrency slot) is held by a token; jobs
that cannot enter it are parked by group (see :mod:`dramatiq_unique.parking.lot`).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Optional, Protocol

from dramatiq_unique.redis import lua

if TYPE_CHECKING:
    from dramatiq_unique.parking.prestart import StartSpec
    from dramatiq_unique.storage.models import JobModel

#: The key of a reservation in a woken message's marker: {"g": group, "t": token}.
WAKE = "wake"

#: Outcomes of :meth:`Gate.release_unless_flagged`: the replies of the scripts behind it.
NOT_HELD, RELEASED, KEPT = lua.NOT_HELD, lua.RELEASED, lua.KEPT


@dataclasses.dataclass(frozen=True)
class GroupInfo:
    """What waking a group's next job needs to know."""

    model: type[JobModel]
    #: "created_at" or "process_after".
    order_by: str
    #: Lease (ms) of a gate handed to a woken job, until it takes it up.
    ttl_ms: float
    #: Set where a woken job needs nothing but this gate: its claim starts it (prestart.py).
    start: Optional[StartSpec] = None


class Gate(Protocol):
    """Something jobs park on.  Tokens are opaque strings; every call may raise
    :class:`~dramatiq_unique.errors.DependencyUnavailable`."""

    #: The prefix of its groups' names (``"lock"`` for ``"lock:<key>"``, :mod:`dramatiq_unique.parking.groups`).
    kind: str
    #: Whether :meth:`release_unless_flagged` reads the flag and releases in one step.
    atomic_release: bool

    def describe(self, group: str) -> Optional[GroupInfo]:
        """The group's table and order; None if this process does not know it."""

    def take(self, group: str, ttl_ms: float) -> Optional[str]:
        """Enter the gate now, for a job about to be woken; None if it is not free."""

    def pass_to(self, group: str, token: str, ttl_ms: float) -> Optional[str]:
        """Re-issue a held gate under a new token; None if ``token`` no longer holds it."""

    def release_unless_flagged(self, group: str, token: str) -> int:
        """Release unless the group is flagged: RELEASED, KEPT or NOT_HELD."""

    def release(self, group: str, token: str) -> None:
        """Release if ``token`` holds it."""

    def retry_in(self, group: str) -> float:
        """ms until the current holder's lease runs out (0 if free)."""

    # Optional, where a gate can do two steps in one call (SlotGate does):
    #   hand_over(group, token) -> (outcome, token): release_unless_flagged that re-issues
    #     the gate to a fresh token when it keeps it;
    #   flag_and_take(group, ttl_ms, delay_ms) -> token or None: flag the group, then take.
    # Optional, where a gate names its holders for the operator's views (SlotGate does):
    #   note(group, token, message_id): the gate under ``token`` went to that job, which waits in
    #     the broker for a worker thread (its row says queued, and holds the gate all the same).


def gate_ttl(gate: Gate, group: str) -> float:
    """The lease (ms) of ``group``'s gate handed to a woken job; a minute if the gate does not know the group."""
    info = gate.describe(group)
    return info.ttl_ms if info is not None else 60_000
