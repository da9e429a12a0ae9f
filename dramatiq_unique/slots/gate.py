"""Concurrency slots in Redis, as a parking gate: a group (``slot:<actor>:<digest>``, or ``:all``
without ``concurrency_key``) is a sorted set of holder tokens scored with when their lease runs out;
each script reads its limit, run-time overrides first.  How: docs/discussions/how-it-is-built.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple, Optional

import redis as redis_lib

from dramatiq_unique.errors import RedisUnavailable, redis_errors
from dramatiq_unique.locks.redlock import new_token
from dramatiq_unique.parking import lot
from dramatiq_unique.parking.groups import SLOT, GroupInfo, actor_of, gate_ttl, slot_key_of, whole_actor
from dramatiq_unique.redis import lua
from dramatiq_unique.redis.lua import KEPT
from dramatiq_unique.slots import overrides
from dramatiq_unique.unique.keys import derive_key

if TYPE_CHECKING:
    from dramatiq_unique.suite import ActorConfig, Suite

#: The limit passed to the scripts for "no declared limit" (overrides still apply).
UNLIMITED = -1
#: The scripts (``redis/lua/slot_<name>.lua``) of the slot operations.
SCRIPTS = ("enter", "pass", "pass_and_deliver", "leave", "renew", "status", "flag_and_take", "note")


def group_key(config: "ActorConfig", message_options: dict, args: tuple, kwargs: dict) -> str:
    """The group key of one call: ``<actor>:<digest of the concurrency_key arguments>``."""
    spec = config.for_message(message_options).concurrency_key
    if spec is None:
        return whole_actor(config.actor_name)
    key = derive_key(config.actor_name, config.fn, spec, args, kwargs)
    assert key is not None
    return key


def declared_limit(config: "ActorConfig") -> int:
    """The limit the scripts get for the actor (overrides still apply)."""
    return UNLIMITED if config.concurrency_limit is None else int(config.concurrency_limit)


class GroupStatus(NamedTuple):
    """A slot group as Redis holds it: holders, the limit in force (-1: none), the group's override and
    the actor's (None: none), ms until a holder's lease runs out (-1: halted), whether Redis holds the
    run-time limits (if not, the overrides are not to be trusted until put back), the limit the group's
    last message brought, and the message ids of the jobs handed a slot that wait in the broker."""

    held: int
    limit: int
    own: Optional[int]
    actor: Optional[int]
    wait: float
    loaded: bool = True
    message: Optional[int] = None
    waiting_holders: tuple[str, ...] = ()


class SlotGate:
    """Concurrency slots as a parking gate (get it with :func:`gate_of`).  Every method may raise
    :class:`~dramatiq_unique.errors.RedisUnavailable`."""

    kind = SLOT
    lost = "the concurrency slot in {} ran out and the group is full"
    #: The flag is read in the release script itself.
    atomic_release = True

    def __init__(self, suite: "Suite", flags: str) -> None:
        self.suite = suite
        self.flags = flags
        self.scripts = {name: lua.register(suite.redis, f"slot_{name}") for name in SCRIPTS}

    def _keys(self, group: str) -> list[str]:
        key = slot_key_of(group)
        keys = self.suite.keys
        return [keys.slots(key), keys.limit(key), keys.actor_limit(actor_of(group)), keys.message_limit(key),
                keys.limits_loaded()]

    def _default(self, group: str) -> int:
        config = self.suite.actor_config(actor_of(group))
        return UNLIMITED if config is None else declared_limit(config)

    def _call(self, name: str, group: str, args: list, extra_keys: tuple = ()) -> Any:
        """The script ``slot_<name>`` on ``group``'s keys (and ``extra_keys``)."""
        keys, script = [*self._keys(group), *extra_keys], self.scripts[name]
        try:
            try:
                return script(keys=keys, args=args)
            except redis_lib.ResponseError as e:
                if not str(e).startswith(overrides.LIMITS_UNKNOWN):
                    raise
            # Redis lost the run-time limits: put them back from the database, then decide.
            overrides.restore_if_lost(self.suite)
            return script(keys=keys, args=args)
        except redis_lib.RedisError as e:
            raise RedisUnavailable(f"concurrency slots of {group!r}: {e}") from e

    def enter(self, group: str, token: str, ttl_ms: float, limit: int, reserved: Optional[str],
              own_limit: Optional[int] = None) -> tuple[bool, float]:
        """Take up ``reserved`` (handed to this job when it was woken) or a free slot: ``(True, 0)``, or
        ``(False, ms until a holder's lease runs out, -1 if halted)``.  ``own_limit``, a message's own,
        becomes the group's default for the decisions taken without the message."""
        args = [limit, token, int(ttl_ms), reserved or "", "" if own_limit is None else int(own_limit)]
        entered, wait = self._call("enter", group, args)
        return bool(entered), float(wait)

    def renew(self, group: str, token: str, ttl_ms: float, limit: int) -> bool:
        return bool(self._call("renew", group, [limit, token, int(ttl_ms)]))

    def status(self, group: str, limit: Optional[int] = None) -> GroupStatus:
        """A suite that may write puts the run-time limits back first if Redis lost them."""
        default = self._default(group) if limit is None else limit
        notes = self.suite.keys.slot_jobs(slot_key_of(group))
        reply = self._call("status", group, [default], (notes,))
        if not int(reply[5]) and overrides.restore_if_lost(self.suite):
            reply = self._call("status", group, [default], (notes,))
        as_int = lambda v: None if v is None else int(v)  # noqa: E731
        held, effective, own, actor, wait, loaded, message = reply[:7]
        waiting = tuple(v.decode() if isinstance(v, bytes) else str(v) for v in reply[7:])
        return GroupStatus(int(held), int(effective), as_int(own), as_int(actor), float(wait), bool(int(loaded)),
                           as_int(message), waiting)

    def note(self, group: str, token: str, message_id: str) -> None:
        """``token``'s slot went to the job of ``message_id``, which waits in the broker for a worker thread:
        noted for the operator's views (the notes of tokens that left are dropped)."""
        key, keys = slot_key_of(group), self.suite.keys
        with redis_errors(f"noting a holder of {group!r}"):
            self.scripts["note"](keys=[keys.slots(key), keys.slot_jobs(key)], args=[token, message_id])

    def describe(self, group: str) -> Optional[GroupInfo]:
        config = self.suite.actor_config(actor_of(group))
        if config is None:  # a per-message concurrency_limit alone still makes groups: no has_slots() here
            return None
        start = None if config.execution_lock else config
        return GroupInfo(config.model, config.unique_order_by, config.concurrency_ttl, start)

    def take(self, group: str, ttl_ms: float) -> Optional[str]:
        token = new_token()
        entered, _ = self.enter(group, token, ttl_ms, self._default(group), None)
        return token if entered else None

    def pass_to(self, group: str, token: str, ttl_ms: float) -> Optional[str]:
        fresh = new_token()
        return fresh if self._call("pass", group, [self._default(group), token, fresh, int(ttl_ms)]) else None

    def hand_over(self, group: str, token: str) -> tuple[int, str]:
        """Leave, re-issuing the slot to a fresh token for the woken job if someone waits (one call)."""
        fresh = new_token()
        args = [self._default(group), token, group, fresh, int(gate_ttl(self, group))]
        outcome = int(self._call("leave", group, args, (self.flags,)))
        return outcome, (fresh if outcome == KEPT else token)

    def pass_and_deliver(self, group: str, token: str, fresh: str, ttl_ms: float, keys: list, args: list) -> bool:
        """Hand the slot held by ``token`` to ``fresh`` and write a local delivery's message, in one step;
        False, with nothing written, if the slot was not held or the group is over its limit."""
        script_args = [self._default(group), token, fresh, int(ttl_ms), *args]
        return bool(self._call("pass_and_deliver", group, script_args, tuple(keys)))

    def flag_and_take(self, group: str, ttl_ms: float, delay_ms: float) -> Optional[str]:
        token = new_token()
        args = [self._default(group), token, int(ttl_ms), group, int(max(delay_ms, 0))]
        return token if self._call("flag_and_take", group, args, (self.flags,)) else None

    def release(self, group: str, token: str) -> None:
        with redis_errors(f"releasing a slot of {group!r}"):
            self.suite.redis.zrem(self._keys(group)[0], token)

    def retry_in(self, group: str) -> float:
        wait = self.status(group).wait
        return lot.RETRY_DELAY if wait < 0 else wait  # halted (limit 0): looked at again as a failed wake-up


def gate_of(suite: "Suite") -> SlotGate:
    """The suite's slot gate, registered with its parking."""
    spot = lot.of(suite)
    gate = spot.gates.get(SLOT)
    if not isinstance(gate, SlotGate):
        gate = SlotGate(suite, spot.wakeups.key)
        spot.register(gate)
    return gate
