"""Actor options: their names, defaults, validation, and the middlewares they need; a message's own
(``send_with_options``) count unless ``None``.  Resolved values: suite.ActorConfig."""

from __future__ import annotations

import functools
import inspect
import math
import re
from typing import TYPE_CHECKING, Any, Callable, Optional, Union

from dramatiq.middleware import Retries

from dramatiq_unique.errors import InvalidOption

if TYPE_CHECKING:
    import dramatiq

#: The lock taken when an actor sets ``unique_args`` but no ``unique_lock``; the other defaults: suite.ActorConfig.
DEFAULT_UNIQUE_LOCK = "until_and_while_executing"
#: Which waiting job of a key runs next.
DEFAULT_UNIQUE_ORDER_BY = "created_at"

UNTIL_EXECUTING = "until_executing"
UNTIL_EXECUTED = "until_executed"
WHILE_EXECUTING = "while_executing"
UNTIL_AND_WHILE_EXECUTING = "until_and_while_executing"
UNTIL_EXPIRED = "until_expired"

LOCK_TYPES = frozenset({UNTIL_EXECUTING, UNTIL_EXECUTED, WHILE_EXECUTING, UNTIL_AND_WHILE_EXECUTING, UNTIL_EXPIRED})
#: Lock types that hold a queue-level lock from enqueue.
QUEUE_LOCKS = frozenset({UNTIL_EXECUTING, UNTIL_EXECUTED, UNTIL_AND_WHILE_EXECUTING, UNTIL_EXPIRED})
#: Lock types whose queue-level hold ends when the job starts.
RELEASED_AT_START = frozenset({UNTIL_EXECUTING, UNTIL_AND_WHILE_EXECUTING})
#: Lock types that hold an execution lock while the job runs.
EXECUTION_LOCKS = frozenset({WHILE_EXECUTING, UNTIL_AND_WHILE_EXECUTING})

CONFLICT_STRATEGIES = frozenset({"skip", "raise", "replace"})
ORDER_BY = frozenset({"created_at", "process_after"})

# -- the options, grouped by the middleware that reads them (its ``actor_options``, so that Dramatiq
# refuses an option whose middleware is not on the broker); groups overlap where two read one option.

#: The job row's own options (JobTracking).
TRACKING_OPTIONS = frozenset({"track", "job_model", "idempotency_window"})
#: A unique job's options, applied as it is sent, started and finished (JobTracking).
UNIQUE_OPTIONS = frozenset(
    {"unique_args", "unique_lock", "unique_on_conflict", "unique_ttl", "unique_window", "unique_order_by"}
)
#: What ExecutionLocks reads: the key, the lock type, the lock's lease, which waiter runs next.
LOCK_OPTIONS = frozenset({"unique_args", "unique_lock", "unique_ttl", "unique_order_by"})
CONCURRENCY_OPTIONS = frozenset({"concurrency_limit", "concurrency_key", "concurrency_ttl"})
#: What ConcurrencySlots reads: the slot options, and which parked job of a group runs next.
SLOT_OPTIONS = CONCURRENCY_OPTIONS | {"unique_order_by"}
#: Every actor option the suite defines; any of them turns tracking on.
SUITE_OPTIONS = UNIQUE_OPTIONS | CONCURRENCY_OPTIONS | TRACKING_OPTIONS


ArgsSpec = Union[None, bool, list, tuple, Callable[..., Any]]

#: A repr that names a memory address (``<object object at 0x7f...>``): no stable form across processes, no key.
ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")

#: The longest time an option may give (ms): ten years; past it, surely a unit mistake that overflows a date.
MAX_MS = 10 * 365 * 24 * 3600 * 1000

#: Message options that ``submit()`` sets; checked at send like the suite's options.
SUBMIT_OPTIONS = frozenset({"idempotency_key", "owner"})
#: The longest ``idempotency_key`` or ``owner``: the width of their columns.
MAX_KEY_LENGTH = 255


def show(value: Any, limit: int = 60) -> str:
    """``repr(value)``, cut short: an error message must stay readable whatever was passed."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}...({len(text)} characters)"


def lookup(message_options: dict, actor_options: dict, name: str, default: Any = None) -> Any:
    """The option's value: the message's, else the actor's, else ``default``."""
    value = message_options.get(name)
    if value is None:
        value = actor_options.get(name)
    return default if value is None else value


def is_tracked(actor_options: dict) -> bool:
    """Whether an actor's jobs get a row: any suite option implies tracking."""
    return actor_options.get("track") is True or any(
        actor_options.get(name) is not None for name in SUITE_OPTIONS - {"track"})


def _check_ms(name: str, value: Any, fn: Any, *, delay: bool = False) -> None:
    """Times are whole milliseconds (``1500.0`` too), at least 1: ``1.5`` is refused, not rounded, as Redis and
    the row's lease count whole milliseconds and a rounding would hide a unit mistake (seconds for ms).  A
    ``delay`` is any finite number: negative means "now", as Dramatiq takes it."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or (isinstance(value, float) and not (math.isfinite(value) and (delay or value.is_integer()))):
        raise InvalidOption(f"{name} must be a {'' if delay else 'whole '}number of milliseconds, not {show(value)}")
    if value < 1 and not delay:
        raise InvalidOption(f"{name} must be positive, not {show(value)}")
    if value > MAX_MS:
        raise InvalidOption(f"{name} must be at most {MAX_MS} ms (ten years), not {show(value)}")


def check_delay(delay: Any) -> None:
    """A send's ``delay`` (ms): a finite number; negative means "now", as Dramatiq takes it."""
    _check_ms("delay", delay, None, delay=True)


def _check(fits: Callable[[Any], bool], what: str) -> Callable[[str, Any, Any], None]:
    """A check that refuses a value (other than None) that does not ``fit``: ``<name> must be <what>``."""

    def check(name: str, value: Any, fn: Any) -> None:
        if value is not None and not fits(value):
            raise InvalidOption(f"{name} must be {what}, not {show(value)}")

    return check


def _choice(allowed: frozenset) -> Callable[[str, Any, Any], None]:
    # isinstance first: an unhashable value (a list) must not raise TypeError in the look-up.
    return _check(lambda value: isinstance(value, str) and value in allowed, f"one of {sorted(allowed)}")


@functools.lru_cache(maxsize=1024)
def signature_of(fn: Callable[..., Any]) -> Optional[inspect.Signature]:
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):  # builtins and some C callables have no signature
        return None


def check_args_spec(name: str, spec: ArgsSpec, fn: Callable[..., Any]) -> None:
    """Validate a ``unique_args``/``concurrency_key`` value against the actor's function."""
    if spec is None or callable(spec):
        return
    params = getattr(signature_of(fn), "parameters", None)  # None: no signature to check against
    if spec is not True:
        if not isinstance(spec, (list, tuple)):
            raise InvalidOption(f"{name} must be a list of parameter names, True or a callable, not {show(spec)}")
        for arg in spec:
            if not isinstance(arg, str):
                raise InvalidOption(f"{name} entries must be parameter names, not {show(arg)}")
            if params is not None and arg not in params:
                raise InvalidOption(f"{name} names {show(arg)}, which {fn.__qualname__}() has no parameter for")
    # A default that makes the key must have the same form in every process (no memory address in its repr).
    for param in (params or {}).values():
        if param.default is inspect.Parameter.empty or (spec is not True and param.name not in spec):
            continue
        if ADDRESS.search(repr(param.default)):
            raise InvalidOption(
                f"{name} uses parameter {param.name!r}, whose default {show(param.default)} has no stable "
                f"form across processes (its repr holds a memory address): use None or a plain value "
                f"as the default, or give {name} a callable"
            )


#: Each option's check, in the order validate() runs them (the first bad value is the one
#: reported).  ``job_model`` is checked where its table is made (Suite.configure_actor).
_CHECKS: dict[str, Callable[[str, Any, Callable[..., Any]], None]] = {
    "unique_args": check_args_spec,
    "concurrency_key": check_args_spec,
    "unique_lock": _choice(LOCK_TYPES),
    "unique_on_conflict": _choice(CONFLICT_STRATEGIES),
    "unique_order_by": _choice(ORDER_BY),
    "unique_ttl": _check_ms,
    "unique_window": _check_ms,
    "concurrency_ttl": _check_ms,
    "idempotency_window": _check_ms,
    "concurrency_limit": _check(lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0,
                                "a whole number, 0 or more"),
    "track": _check(lambda value: isinstance(value, bool), "True or False"),
}


def validate(options: dict, fn: Callable[..., Any]) -> None:
    """Raise :class:`InvalidOption` for any bad suite option value (at declaration or send)."""
    for name, check in _CHECKS.items():
        check(name, options.get(name), fn)
    if options.get("unique_args") is None:
        # unique_ttl (the row lease) and unique_order_by also serve actors without uniqueness.
        for name in ("unique_lock", "unique_on_conflict", "unique_window"):
            if options.get(name) is not None:
                raise InvalidOption(f"{name} has no effect without unique_args")


def check_send(message_options: dict, actor_options: dict, fn: Callable[..., Any], *,
               broker: "Optional[dramatiq.Broker]" = None, actor_name: str = "") -> None:
    """Check a send's own options (``send_with_options``, ``submit()``'s) as the actor's were at declaration,
    before anything is written or published, and the middlewares they need on ``broker``."""
    given = message_options.keys() & (SUITE_OPTIONS | SUBMIT_OPTIONS)
    if not given:
        return  # the common send: nothing of its own to check
    if message_options.get("job_model") is not None:
        raise InvalidOption("job_model cannot be set per message: it names the actor's job table")
    for name, shortest, what in (("idempotency_key", 1, "a non-empty str"), ("owner", 0, "a str")):
        value = message_options.get(name)
        if value is not None and (not isinstance(value, str) or not shortest <= len(value) <= MAX_KEY_LENGTH):
            raise InvalidOption(f"{name} must be {what} of at most {MAX_KEY_LENGTH} characters, not {show(value)}")
    if not given & SUITE_OPTIONS:
        return
    # What the send will run with: its own options over the actor's, as lookup() resolves them.
    validate({name: lookup(message_options, actor_options, name) for name in SUITE_OPTIONS}, fn)
    own = {name: message_options[name] for name in given & SUITE_OPTIONS if message_options[name] is not None}
    if own and broker is not None:
        check(f"{actor_name} (a message's own options)", {**actor_options, **own}, _installed(broker))


# -- which of the suite's middlewares (each named by its ``capability``) an actor needs, in which order:
# what Dramatiq's own check of ``actor_options`` cannot know.

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
    """Refuse an actor whose suite options are bad, or need a middleware the broker lacks or has out of order."""
    validate(actor.options, actor.fn)
    check(actor.actor_name, actor.options, _installed(broker))


def _installed(broker: "dramatiq.Broker") -> list[Optional[str]]:
    return [RETRIES if isinstance(m, Retries) else getattr(m, "capability", None) for m in broker.middleware]


def needed(options: dict) -> dict[str, str]:
    """The suite's middlewares an actor's options need, each with the option that needs it."""
    if not is_tracked(options):
        return {}
    needs = {}
    slot_option = next((n for n in ("concurrency_limit", "concurrency_key") if options.get(n) is not None), None)
    if slot_option is not None:
        needs[SLOTS] = slot_option
    lock = options.get("unique_lock") or DEFAULT_UNIQUE_LOCK
    if options.get("unique_args") is not None and lock in EXECUTION_LOCKS:
        needs[LOCKS] = f"unique_lock={lock!r}"
    needs[TRACKING] = next(name for name in sorted(SUITE_OPTIONS) if options.get(name) is not None)
    return needs


def check(actor_name: str, options: dict, installed: list[Optional[str]]) -> None:
    """:func:`check_actor` on the names of the broker's middlewares (:func:`_installed`)."""
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
