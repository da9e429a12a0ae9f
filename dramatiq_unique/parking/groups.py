"""The names of parking groups, built and read here only: ``lock:<unique key>`` (an execution lock)
and ``slot:<group key>`` (a slot group: ``<actor>:<digest>``, or ``<actor>:all``).

Deployed data: stored in ``parked_on``, in the wake-up flags and in a slot group's Redis keys.
Their form must never change.
"""

from __future__ import annotations

#: The kind of the groups of jobs waiting for an execution lock.
LOCK = "lock"
#: The kind of the groups of jobs waiting for a concurrency slot.
SLOT = "slot"
#: The group-key suffix of an actor without ``concurrency_key``: one group per actor.
WHOLE_ACTOR = "all"


def kind_of(group: str) -> str:
    return group.split(":", 1)[0]


def lock_group(unique_key: str) -> str:
    return f"{LOCK}:{unique_key}"


def unique_key_of(group: str) -> str:
    """The unique key of a group ``lock:<unique key>``."""
    return group.split(":", 1)[1]


def slot_group(key: str) -> str:
    return f"{SLOT}:{key}"


def slot_key_of(group: str) -> str:
    """The group key of a slot group ``slot:<group key>``."""
    return group.split(":", 1)[1]


def whole_actor(actor_name: str) -> str:
    """The group key of an actor without ``concurrency_key``."""
    return f"{actor_name}:{WHOLE_ACTOR}"


def slot_groups_of(actor_name: str) -> str:
    """The prefix of the names of all the slot groups of an actor (for a prefix match)."""
    return f"{SLOT}:{actor_name}:"


def actor_of(group: str) -> str:
    """The actor of a lock or slot group: what lies between the kind and the last colon
    (an actor's name may hold colons; a digest or ``all`` does not)."""
    return group.split(":", 1)[1].rsplit(":", 1)[0]
