"""Concurrency slots in Redis: at most ``limit`` holders per group, leased.

A *group* is what a limit applies to: an actor, or an actor and one
value of its ``concurrency_key`` (hashed like unique keys, so no user
data sits raw in a Redis key).  Its parking name is ``slot:<group key>``
and its group key ``<actor name>:<digest>``, or ``<actor name>:all``
for an actor without ``concurrency_key`` (:mod:`dramatiq_unique.parking.groups`).

Each group is a Redis sorted set of holder tokens scored with the
moment their lease runs out (Redis server time, ms).  Every script
first drops the members whose lease ran out, so a holder that died
(SIGKILL) stops counting ``concurrency_ttl`` after its last renewal,
whoever looks next.  The group's limit is read in the same script:

1. the group's override (``set_concurrency_limit(actor, n, key=...)``),
2. else the actor's override (``set_concurrency_limit(actor, n)``),
3. else the limit the group's last message brought, if messages override
   ``concurrency_limit`` (``send_with_options``; kept for a day),
4. else the declared ``concurrency_limit`` (passed in; -1: no limit).

So a new limit applies to every worker's next decision at once.  A
group over its limit (lowered, or halted with 0) keeps its running jobs
and hands no freed slot on until it is under the limit again.

Slots are a :class:`~dramatiq_unique.parking.gates.Gate` with up to ``limit``
holders: a job that finds its group full is parked, and a holder that
leaves hands its own slot to the group's next parked job (one slot, one
waiter: no herd).  They live on the suite's first Redis master (no
Redlock quorum: a slot is a count, not a mutual exclusion).
"""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING, Any, Optional

import redis as redis_lib

from dramatiq_unique import options as opt
from dramatiq_unique.errors import LockLost, RedisUnavailable
from dramatiq_unique.locks.redlock import new_token
from dramatiq_unique.parking import flags as wakeups
from dramatiq_unique.parking import lot as parking
from dramatiq_unique.parking import prestart
from dramatiq_unique.parking.gates import KEPT, GroupInfo, gate_ttl
from dramatiq_unique.parking.groups import SLOT, actor_of, slot_key_of, whole_actor
from dramatiq_unique.parking.waking import RETRY_DELAY
from dramatiq_unique.redis import scripts
from dramatiq_unique.redis.keys import derive_key

if TYPE_CHECKING:
    from dramatiq_unique.suite import ActorConfig, Suite

#: The limit passed to the scripts for "no declared limit" (overrides still apply).
UNLIMITED = -1
#: ms before a halted group (limit 0) is looked at again by the wake-up watchdog.
HALTED_RETRY = RETRY_DELAY

# Every script: KEYS[1] the group's sorted set, KEYS[2] its limit override, KEYS[3] the
# actor's limit override, KEYS[4] the limit its messages brought; ARGV[1] the declared limit (-1: none).
_PRELUDE = """
local t = redis.call('time')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
redis.call('zremrangebyscore', KEYS[1], '-inf', now)
local limit = tonumber(redis.call('get', KEYS[2]) or redis.call('get', KEYS[3]) or redis.call('get', KEYS[4])
  or ARGV[1])
local held = redis.call('zcard', KEYS[1])
local function full(n) return limit >= 0 and n >= limit end
local function hold(token, ttl)
  redis.call('zadd', KEYS[1], now + ttl, token)
  if redis.call('pttl', KEYS[1]) < ttl then redis.call('pexpire', KEYS[1], ttl) end
end
local function wait()
  if limit == 0 then return -1 end
  local first = redis.call('zrange', KEYS[1], 0, 0, 'WITHSCORES')
  if #first == 0 then return 0 end
  return math.max(tonumber(first[2]) - now, 0)
end
"""
# ARGV token, ttl, reserved token or "", the message's own limit or "".  Enter: take up a
# reservation, or a free slot.  Returns {1, 0} when entered, else {0, ms until a holder's lease
# runs out (-1: halted)}.  A token that already holds a slot entered before (a call sent again
# after its reply was lost, scripts.py): it is in, with no second slot.
_ENTER = """
if ARGV[5] ~= '' then redis.call('set', KEYS[4], ARGV[5], 'PX', 86400000) end
""" + _PRELUDE + """
if redis.call('zscore', KEYS[1], ARGV[2]) then hold(ARGV[2], tonumber(ARGV[3])) return {1, 0} end
if ARGV[4] ~= '' and redis.call('zrem', KEYS[1], ARGV[4]) == 1 then held = held - 1 end
if full(held) then return {0, wait()} end
hold(ARGV[2], tonumber(ARGV[3]))
return {1, 0}
"""
# ARGV token, new token, ttl.  Hand a held slot on, unless the group is over its limit
# without it (then it is given up).  1 handed on, 0 not.  A repeat finds the new token in: 1.
_PASS = _PRELUDE + """
if redis.call('zscore', KEYS[1], ARGV[3]) then return 1 end
if redis.call('zrem', KEYS[1], ARGV[2]) == 0 then return 0 end
if full(held - 1) then return 0 end
hold(ARGV[3], tonumber(ARGV[4]))
return 1
"""
# KEYS[5], KEYS[6] a woken message's hash and ack set (delivery._CLAIM); ARGV token, new token,
# ttl, message id, body.  _PASS, and on success the local delivery's writes (ondeck.py).  A
# repeat finds the new token in: 1, nothing written again (the message may be taken by now).
_PASS_AND_DELIVER = _PRELUDE + """
if redis.call('zscore', KEYS[1], ARGV[3]) then return 1 end
if redis.call('zrem', KEYS[1], ARGV[2]) == 0 then return 0 end
if full(held - 1) then return 0 end
hold(ARGV[3], tonumber(ARGV[4]))
redis.call('hset', KEYS[5], ARGV[5], ARGV[6])
redis.call('sadd', KEYS[6], ARGV[5])
return 1
"""
# KEYS[5] the parking flags; ARGV token, group, new token or "", ttl.  Leave, unless someone
# waits and could have the slot: then keep it for them, re-issued at once to the new token if
# one is given (the woken job's: one round trip fewer on every hand-over).  1 released, 2 kept
# or handed on, 0 not held (its lease ran out, or a repeat after a release: harmless, the
# caller only looks whether someone waits).  A repeat that finds the new token in: 2.
_LEAVE = _PRELUDE + """
if ARGV[4] ~= '' and redis.call('zscore', KEYS[1], ARGV[4]) then return 2 end
if not redis.call('zscore', KEYS[1], ARGV[2]) then return 0 end
if redis.call('zscore', KEYS[5], ARGV[3]) and not full(held - 1) then
  if ARGV[4] ~= '' then
    redis.call('zrem', KEYS[1], ARGV[2])
    hold(ARGV[4], tonumber(ARGV[5]))
  end
  return 2
end
redis.call('zrem', KEYS[1], ARGV[2])
return 1
"""
# KEYS[5] the parking flags; ARGV token, ttl, group, delay.  A job just parked: flag its group
# (due in delay ms), then look at the slots once more and take one if free.  1 taken, 0 not.
# A repeat finds its token in: 1.
_FLAG_AND_TAKE = _PRELUDE + wakeups.FLAG_FUNCTION + """
flag(KEYS[5], ARGV[4], now + tonumber(ARGV[5]))
if redis.call('zscore', KEYS[1], ARGV[2]) then return 1 end
if full(held) then return 0 end
hold(ARGV[2], tonumber(ARGV[3]))
return 1
"""
# ARGV token, ttl.  heartbeat(): renew the lease; a lapsed holder gets back in if there
# is room.  1 renewed, 0 lost.  A repeat renews again.
_RENEW = _PRELUDE + """
if redis.call('zscore', KEYS[1], ARGV[2]) or not full(held) then
  hold(ARGV[2], tonumber(ARGV[3]))
  return 1
end
return 0
"""
# {holders, effective limit, group override, actor override, ms until a lease runs out}
_STATUS = _PRELUDE + """
return {held, limit, redis.call('get', KEYS[2]), redis.call('get', KEYS[3]), wait()}
"""


def group_key(config: "ActorConfig", message_options: dict, args: tuple, kwargs: dict) -> str:
    """The group key of one call: ``<actor>:<digest of the concurrency_key arguments>``."""
    spec = config.get(message_options, "concurrency_key")
    if spec is None:
        return whole_actor(config.actor_name)
    key = derive_key(config.actor_name, config.fn, spec, args, kwargs)
    assert key is not None
    return key


def declared_limit(config: "ActorConfig", message_options: Optional[dict] = None) -> int:
    limit = config.get(message_options or {}, "concurrency_limit")
    return UNLIMITED if limit is None else int(limit)


def has_slots(config: "ActorConfig", message_options: Optional[dict] = None) -> bool:
    """Whether the actor's jobs take slots: a limit or a key is declared (a key alone
    means "no limit unless ``set_concurrency_limit`` sets one for that key")."""
    opts = message_options or {}
    return config.get(opts, "concurrency_limit") is not None or config.get(opts, "concurrency_key") is not None


def ttl_of(config: "ActorConfig", message_options: Optional[dict] = None) -> float:
    return float(config.get(message_options or {}, "concurrency_ttl", opt.DEFAULT_CONCURRENCY_TTL))


class SlotGate:
    """Concurrency slots as a parking :class:`~dramatiq_unique.parking.gates.Gate`.

    Get it with :func:`gate_of`.  Every method may raise
    :class:`~dramatiq_unique.errors.RedisUnavailable`.
    """

    kind = SLOT
    #: The flag is read in the release script itself.
    atomic_release = True

    def __init__(self, suite: "Suite", flags: str) -> None:
        self.suite = suite
        self.flags = flags
        client = suite.redis
        self._enter = scripts.register(client, _ENTER)
        self._pass = scripts.register(client, _PASS)
        self._pass_and_deliver = scripts.register(client, _PASS_AND_DELIVER)
        self._leave = scripts.register(client, _LEAVE)
        self._renew = scripts.register(client, _RENEW)
        self._status = scripts.register(client, _STATUS)
        self._flag_and_take = scripts.register(client, _FLAG_AND_TAKE)

    def _keys(self, group: str) -> list[str]:
        key = slot_key_of(group)
        keys = self.suite.keys
        return [keys.slots(key), keys.limit(key), keys.actor_limit(actor_of(group)), keys.message_limit(key)]

    def _config(self, group: str) -> "Optional[ActorConfig]":
        return self.suite.actor_config(actor_of(group))

    def _default(self, group: str) -> int:
        config = self._config(group)
        return UNLIMITED if config is None else declared_limit(config)

    def _call(self, script: Any, group: str, args: list, extra_keys: tuple = ()) -> Any:
        try:
            return script(keys=[*self._keys(group), *extra_keys], args=args)
        except redis_lib.RedisError as e:
            raise RedisUnavailable(f"concurrency slots of {group!r}: {e}") from e

    # -- for the middleware ---------------------------------------------------

    def enter(self, group: str, token: str, ttl_ms: float, limit: int, reserved: Optional[str],
              own_limit: Optional[int] = None) -> tuple[bool, float]:
        """Take up ``reserved`` (a slot handed to this job when it was woken) or a free slot.

        ``own_limit`` is a limit the message brought (``send_with_options``):
        it becomes the group's default, for the decisions taken without the
        message (hand-overs, wake-ups).  Returns ``(True, 0)``, or ``(False,
        ms until a holder's lease runs out, -1 if the group is halted)``.
        """
        args = [limit, token, int(ttl_ms), reserved or "", "" if own_limit is None else int(own_limit)]
        entered, wait = self._call(self._enter, group, args)
        return bool(entered), float(wait)

    def renew(self, group: str, token: str, ttl_ms: float, limit: int) -> bool:
        return bool(self._call(self._renew, group, [limit, token, int(ttl_ms)]))

    def status(self, group: str, limit: Optional[int] = None) -> tuple[int, int, Optional[int], Optional[int], float]:
        """(holders, effective limit, group override, actor override, ms until a lease runs out)."""
        default = self._default(group) if limit is None else limit
        held, effective, own, actor, wait = self._call(self._status, group, [default])
        as_int = lambda v: None if v is None else int(v)  # noqa: E731
        return int(held), int(effective), as_int(own), as_int(actor), float(wait)

    # -- the Gate protocol ------------------------------------------------------

    def describe(self, group: str) -> Optional[GroupInfo]:
        config = self._config(group)
        if config is None:  # a per-message concurrency_limit alone still makes groups: no has_slots() here
            return None
        order_by = config.options.get("unique_order_by") or opt.DEFAULT_UNIQUE_ORDER_BY
        return GroupInfo(config.model, order_by, ttl_of(config), prestart.spec_for(config))

    def take(self, group: str, ttl_ms: float) -> Optional[str]:
        token = new_token()
        entered, _ = self.enter(group, token, ttl_ms, self._default(group), None)
        return token if entered else None

    def pass_to(self, group: str, token: str, ttl_ms: float) -> Optional[str]:
        fresh = new_token()
        return fresh if self._call(self._pass, group, [self._default(group), token, fresh, int(ttl_ms)]) else None

    def release_unless_flagged(self, group: str, token: str) -> int:
        return int(self._call(self._leave, group, [self._default(group), token, group, "", 0], (self.flags,)))

    # -- one round trip instead of two, where parking can use it -------------------

    def hand_over(self, group: str, token: str) -> tuple[int, str]:
        """Leave, re-issuing the slot to a fresh token if someone waits: ``(KEPT, fresh)``,
        ``(RELEASED, token)`` or ``(NOT_HELD, token)``.  The fresh token is the woken job's."""
        fresh = new_token()
        args = [self._default(group), token, group, fresh, int(gate_ttl(self, group))]
        outcome = int(self._call(self._leave, group, args, (self.flags,)))
        return outcome, (fresh if outcome == KEPT else token)

    def pass_and_deliver(self, group: str, token: str, fresh: str, ttl_ms: float, keys: list, args: list) -> bool:
        """Hand the slot held by ``token`` to ``fresh`` and write a local delivery's message
        (``keys``/``args`` of :class:`~dramatiq_unique.broker.delivery.LocalDelivery`), in one step;
        False, with nothing written, if the slot was not held or the group is over its limit."""
        script_args = [self._default(group), token, fresh, int(ttl_ms), *args]
        return bool(self._call(self._pass_and_deliver, group, script_args, tuple(keys)))

    def flag_and_take(self, group: str, ttl_ms: float, delay_ms: float) -> Optional[str]:
        """Flag ``group`` (its waiters are due for a look in ``delay_ms``) and take a free slot
        if there is one, in one step: a token, or None."""
        token = new_token()
        args = [self._default(group), token, int(ttl_ms), group, int(max(delay_ms, 0))]
        return token if self._call(self._flag_and_take, group, args, (self.flags,)) else None

    def release(self, group: str, token: str) -> None:
        try:
            self.suite.redis.zrem(self._keys(group)[0], token)
        except redis_lib.RedisError as e:
            raise RedisUnavailable(f"releasing a slot of {group!r}: {e}") from e

    def retry_in(self, group: str) -> float:
        wait = self.status(group)[4]
        return HALTED_RETRY if wait < 0 else wait


def gate_of(suite: "Suite") -> SlotGate:
    """The suite's slot gate, registered with its parking (one per suite)."""
    spot = parking.of(suite)
    gate = spot.gates.get(SLOT)
    if not isinstance(gate, SlotGate):
        gate = SlotGate(suite, spot.flags)
        spot.register(gate)
    return gate


@dataclasses.dataclass
class HeldSlot:
    """A slot held by one attempt; :meth:`renew` is its ``heartbeat()`` renewer."""

    gate: SlotGate
    group: str
    token: str
    ttl_ms: float
    limit: int

    def renew(self) -> float:
        started = time.monotonic()
        if not self.gate.renew(self.group, self.token, self.ttl_ms, self.limit):
            raise LockLost(f"the concurrency slot in {self.group} ran out and the group is full")
        return self.ttl_ms / 1000 - (time.monotonic() - started)
