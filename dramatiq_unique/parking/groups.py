"""The names of parking groups: what jobs queue for, built and read here only.

A group's name is ``<kind>:<rest>``, the kind naming its gate
(:attr:`~dramatiq_unique.parking.gates.Gate.kind`).  The suite's two kinds:

* ``lock:<unique key>``: the execution lock of one unique key
  (:mod:`dramatiq_unique.locks.execution`), a unique key being
  ``<actor name>:<digest>``;
* ``slot:<group key>``: a group of concurrency slots
  (:mod:`dramatiq_unique.slots.gate`), its group key being
  ``<actor name>:<digest>`` (one value of the actor's ``concurrency_key``)
  or ``<actor name>:all`` (an actor without one).

These names are deployed data: they are stored in the job table's
``parked_on`` column and in the Redis wake-up flags, and a slot group's
key is part of its Redis keys.  Their form must never change.
"""

from __future__ import annotations

#: The kind of the groups of jobs waiting for an execution lock.
LOCK = "lock"
#: The kind of the groups of jobs waiting for a concurrency slot.
SLOT = "slot"
#: The group-key suffix of an actor without ``concurrency_key``: one group per actor.
WHOLE_ACTOR = "all"


def kind_of(group: str) -> str:
    """The kind a group's name starts with: ``"lock"`` for ``lock:<unique key>``."""
    return group.split(":", 1)[0]


def _rest(group: str) -> str:
    return group.split(":", 1)[1]


def lock_group(unique_key: str) -> str:
    """The group of the jobs waiting for the execution lock of ``unique_key``."""
    return f"{LOCK}:{unique_key}"


def unique_key_of(group: str) -> str:
    """The unique key of a group ``lock:<unique key>``."""
    return _rest(group)


def slot_group(key: str) -> str:
    """The name of the slot group whose group key is ``key``."""
    return f"{SLOT}:{key}"


def slot_key_of(group: str) -> str:
    """The group key of a slot group ``slot:<group key>``."""
    return _rest(group)


def whole_actor(actor_name: str) -> str:
    """The group key of an actor without ``concurrency_key``: ``<actor name>:all``."""
    return f"{actor_name}:{WHOLE_ACTOR}"


def slot_groups_of(actor_name: str) -> str:
    """The prefix of the names of all the slot groups of an actor (for a prefix match)."""
    return f"{SLOT}:{actor_name}:"


def actor_of(group: str) -> str:
    """The actor of a lock or slot group: what lies between the kind and the last colon
    (an actor's name may hold colons; a digest or ``all`` does not)."""
    return _rest(group).rsplit(":", 1)[0]
