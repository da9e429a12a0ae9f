"""The words parking and its gates share: the names of parking groups, built and read here only, the gate
protocol (what jobs park on: an execution lock, a slot), and a woken job's reservation.

A group is ``lock:<unique key>`` (an execution lock) or ``slot:<group key>`` (a slot group: ``<actor>:<digest>``,
or ``<actor>:all``).  Deployed data: stored in ``parked_on``, in the wake-up flags and in a slot group's Redis keys.
Their form must never change.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Optional, Protocol

from dramatiq_unique.observe import events

if TYPE_CHECKING:
    from dramatiq_unique.storage.models import JobModel
    from dramatiq_unique.suite import ActorConfig

#: The kind of the groups of jobs waiting for an execution lock.
LOCK = "lock"
#: The kind of the groups of jobs waiting for a concurrency slot.
SLOT = "slot"


def kind_of(group: str) -> str:
    return group.split(":", 1)[0]


def lock_group(unique_key: str) -> str:
    return f"{LOCK}:{unique_key}"


def key_of(group: str) -> str:
    """The key of a group: a lock group's unique key, a slot group's group key."""
    return group.split(":", 1)[1]


unique_key_of = slot_key_of = key_of


def slot_group(key: str) -> str:
    return f"{SLOT}:{key}"


def whole_actor(actor_name: str) -> str:
    """The group key of an actor without ``concurrency_key``: one group per actor."""
    return f"{actor_name}:all"


def slot_groups_of(actor_name: str) -> str:
    """The prefix of the names of all the slot groups of an actor (for a prefix match)."""
    return f"{SLOT}:{actor_name}:"


def actor_of(group: str) -> str:
    """The actor of a lock or slot group: what lies between the kind and the last colon
    (an actor's name may hold colons; a digest or ``all`` does not)."""
    return group.split(":", 1)[1].rsplit(":", 1)[0]


#: The key of a reservation in a woken message's marker (:func:`reservation`).
WAKE = "wake"


@dataclasses.dataclass(frozen=True)
class GroupInfo:
    """What waking a group's next job needs to know."""

    model: type[JobModel]
    #: "created_at" or "process_after".
    order_by: str
    #: Lease (ms) of a gate handed to a woken job, until it takes it up.
    ttl_ms: float
    #: The actor, where a woken job needs nothing but this gate (no execution lock may still park it
    #: once it has its slot, and a running row cannot be parked): its claim starts it, with the
    #: actor's ``unique_ttl`` as its lease, releasing its unique hold where the lock type says so.
    start: Optional[ActorConfig] = None


class Gate(Protocol):
    """Something jobs park on, held by opaque tokens; every call may raise
    :class:`~dramatiq_unique.errors.DependencyUnavailable`."""

    #: The prefix of its groups' names (``"lock"`` for ``"lock:<key>"``).
    kind: str
    #: Whether :meth:`hand_over` reads the flag and releases in one step.
    atomic_release: bool
    #: What LockLost says when a holder's lease of a group (``{}``) is gone.
    lost: str

    def describe(self, group: str) -> Optional[GroupInfo]:
        """The group's table and order; None if this process does not know it."""

    def take(self, group: str, ttl_ms: float) -> Optional[str]:
        """Enter now, for a job about to be woken; None if it is not free."""

    def flag_and_take(self, group: str, ttl_ms: float, delay_ms: float) -> Optional[str]:
        """Flag ``group`` (its waiters are due for a look in ``delay_ms``), then :meth:`take`."""

    def pass_to(self, group: str, token: str, ttl_ms: float) -> Optional[str]:
        """Re-issue a held gate under a new token; None if ``token`` no longer holds it."""

    def hand_over(self, group: str, token: str) -> tuple[int, str]:
        """Release unless the group is flagged: RELEASED, KEPT or NOT_HELD, and the token the woken job gets
        if KEPT: a fresh one where the gate re-issues it in the same call, else ``token`` (:meth:`pass_to` follows)."""

    def release(self, group: str, token: str) -> None:
        """Release if ``token`` holds it."""

    def retry_in(self, group: str) -> float:
        """ms until the current holder's lease runs out (0 if free)."""

    def renew(self, group: str, token: str, ttl_ms: float, limit: int) -> bool:
        """False if ``token`` lost the gate."""

    # Optional (SlotGate has them): pass_and_deliver(), used by the deck; note(group, token,
    # message_id), naming for the operator's views the job a woken token went to.


def reservation(group: str, token: str, worker_id: str, asked: float) -> dict:
    """A woken job's reservation of ``group``'s gate under ``token``, with who granted it and when
    (``asked``, monotonic: before the grant and the claim's start were asked for, whose leases run
    from then however late their replies came): a job woken in the same process soon after takes it
    up without asking Redis."""
    return {"g": group, "t": token, "w": worker_id, "at": int(asked * 1000),
            events.HANDED_AT: events.now_ms()}


def gate_ttl(gate: Gate, group: str) -> float:
    """The lease (ms) of ``group``'s gate handed to a woken job; a minute if the gate does not know the group."""
    info = gate.describe(group)
    return info.ttl_ms if info is not None else 60_000
