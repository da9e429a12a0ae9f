"""Which of the suite's middlewares an actor needs, checked when it is declared.

The middlewares can be added one by one (``broker.add_middleware``).  Dramatiq
already refuses an option that no middleware declares; this adds what it cannot
know: a job row that the lock or slot of an actor waits on, a lock type whose
execution lock no middleware would take, the order in which the middlewares must
sit.  Without it such an actor's jobs would run silently without what they ask for.

Each suite middleware names itself with a ``capability`` class attribute (a
subclass keeps it) and calls :func:`check_actor` from ``before_declare_actor``:
the check holds whichever of them are installed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from dramatiq.middleware import Retries

from dramatiq_unique import options as opt
from dramatiq_unique.errors import InvalidOption

if TYPE_CHECKING:
    import dramatiq

#: The suite's middlewares by name, in the order they must sit on the broker: a job takes
#: its slot, then its execution lock, then its row is started.
SLOTS, LOCKS, TRACKING = "ConcurrencySlots", "ExecutionLocks", "JobTracking"
ORDER = (SLOTS, LOCKS, TRACKING)
#: Dramatiq's Retries, which JobTracking must come before: its outcome then follows Retries' decision.
RETRIES = "Retries"

#: Why a middleware is needed, for the error that asks for it.
_WHY = {
    SLOTS: "limits how many jobs run at once, which ConcurrencySlots does",
    LOCKS: "holds an execution lock while the job runs, which ExecutionLocks takes",
    TRACKING: "needs the job row that JobTracking keeps (parked jobs wait on it, fencing tokens live on it)",
}


def check_actor(broker: "dramatiq.Broker", actor: "dramatiq.Actor") -> None:
    """Refuse an actor whose suite options are bad, or need a middleware the broker lacks or has
    out of order (:class:`~dramatiq_unique.errors.InvalidOption`, naming the actor and option)."""
    opt.validate(actor.options, actor.fn)
    check(actor.actor_name, actor.options, _installed(broker))


def check_message(broker: "dramatiq.Broker", actor_name: str, actor_options: dict, message_options: dict) -> None:
    """Refuse a send whose own options (``send_with_options``) need a middleware the actor's did
    not: ``unique_lock="while_executing"`` on a broker without ExecutionLocks would run the job
    unlocked.  Only a message that overrides a suite option is looked at."""
    given = {name: message_options[name] for name in message_options.keys() & opt.SUITE_OPTIONS
             if message_options[name] is not None}  # None: the actor's value (options.lookup)
    if given:
        check(f"{actor_name} (a message's own options)", {**actor_options, **given}, _installed(broker))


def _installed(broker: "dramatiq.Broker") -> list[Optional[str]]:
    return [RETRIES if isinstance(m, Retries) else getattr(m, "capability", None) for m in broker.middleware]


def needed(options: dict) -> dict[str, str]:
    """The suite's middlewares an actor's options need, each with the option that needs it."""
    if not opt.is_tracked(options):
        return {}
    needs = {}
    for name in ("concurrency_limit", "concurrency_key"):
        if options.get(name) is not None:
            needs[SLOTS] = name
            break
    lock = options.get("unique_lock") or opt.DEFAULT_UNIQUE_LOCK
    if options.get("unique_args") is not None and lock in opt.EXECUTION_LOCKS:
        needs[LOCKS] = f"unique_lock={lock!r}"
    needs[TRACKING] = next(name for name in sorted(opt.SUITE_OPTIONS) if options.get(name) is not None)
    return needs


def check(actor_name: str, options: dict, installed: list[Optional[str]]) -> None:
    """:func:`check_actor` on names: ``installed`` names the broker's middlewares in order, each
    suite middleware by its ``capability``, Dramatiq's Retries as ``RETRIES``, any other as None."""
    needs = needed(options)
    for middleware, option in needs.items():
        if middleware not in installed:
            raise InvalidOption(
                f"actor {actor_name!r}: {option} {_WHY[middleware]}: add {middleware} to the broker "
                f"(dramatiq_unique.setup() adds every middleware in its place)"
            )
    present = [name for name in ORDER if name in needs]
    found = sorted(present, key=installed.index)  # by each one's first place on the broker
    if found != present:
        raise InvalidOption(
            f"actor {actor_name!r}: the broker has {', '.join(found)} in this order; add them as "
            f"{', then '.join(present)} (a job takes its slot, then its lock, then its row)"
        )
    if TRACKING in needs and RETRIES in installed and installed.index(TRACKING) > installed.index(RETRIES):
        raise InvalidOption(
            f"actor {actor_name!r}: JobTracking comes after Retries on the broker: add it with "
            f"before=Retries, so that the outcome it records follows what Retries decided"
        )
