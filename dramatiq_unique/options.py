"""Actor options: their names, defaults, validation and look-up.

Options live in ``actor.options``; a message may override them through
``send_with_options``.  Look-ups go message, then actor, then default,
with ``is None`` so that a falsy value such as ``0`` is kept.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Optional, Union

from .errors import InvalidOption

#: The lock taken when an actor sets ``unique_args`` but no ``unique_lock``.
DEFAULT_UNIQUE_LOCK = "until_and_while_executing"

#: What a duplicate send does by default.
DEFAULT_UNIQUE_ON_CONFLICT = "skip"

#: Lease (ms) of a running job's row and execution lock.
DEFAULT_UNIQUE_TTL = 60_000

#: Which waiting job of a key runs next.
DEFAULT_UNIQUE_ORDER_BY = "created_at"

#: Lease (ms) of a concurrency slot.
DEFAULT_CONCURRENCY_TTL = 60_000

UNTIL_EXECUTING = "until_executing"
UNTIL_EXECUTED = "until_executed"
WHILE_EXECUTING = "while_executing"
UNTIL_AND_WHILE_EXECUTING = "until_and_while_executing"
UNTIL_EXPIRED = "until_expired"

LOCK_TYPES = frozenset(
    {UNTIL_EXECUTING, UNTIL_EXECUTED, WHILE_EXECUTING, UNTIL_AND_WHILE_EXECUTING, UNTIL_EXPIRED}
)
#: Lock types that hold a queue-level lock from enqueue.
QUEUE_LOCKS = frozenset({UNTIL_EXECUTING, UNTIL_EXECUTED, UNTIL_AND_WHILE_EXECUTING, UNTIL_EXPIRED})
#: Lock types whose queue-level hold ends when the job starts.
RELEASED_AT_START = frozenset({UNTIL_EXECUTING, UNTIL_AND_WHILE_EXECUTING})
#: Lock types that hold an execution lock while the job runs.
EXECUTION_LOCKS = frozenset({WHILE_EXECUTING, UNTIL_AND_WHILE_EXECUTING})

CONFLICT_STRATEGIES = frozenset({"skip", "raise", "replace"})
ORDER_BY = frozenset({"created_at", "process_after"})

UNIQUE_OPTIONS = frozenset(
    {"unique_args", "unique_lock", "unique_on_conflict", "unique_ttl", "unique_window", "unique_order_by"}
)
CONCURRENCY_OPTIONS = frozenset({"concurrency_limit", "concurrency_key", "concurrency_ttl"})
#: Every actor option the suite defines; any of them turns tracking on.
SUITE_OPTIONS = UNIQUE_OPTIONS | CONCURRENCY_OPTIONS | {"track", "job_model", "idempotency_window"}

#: Sentinel distinguishing "not given" from an explicit ``None``.
_MISSING: Any = object()

ArgsSpec = Union[None, bool, list, tuple, Callable[..., Any]]


def lookup(message_options: dict, actor_options: dict, name: str, default: Any = None) -> Any:
    """The option's value: the message's, else the actor's, else ``default``."""
    value = message_options.get(name)
    if value is None:
        value = actor_options.get(name)
    return default if value is None else value


def is_tracked(actor_options: dict) -> bool:
    """Whether an actor's jobs get a row: any suite option implies tracking."""
    if actor_options.get("track") is True:
        return True
    return any(actor_options.get(name) is not None for name in SUITE_OPTIONS - {"track"})


def _check_ms(name: str, value: Any, *, positive: bool) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidOption(f"{name} must be a number of milliseconds, not {value!r}")
    if value < 0 or (positive and value == 0):
        raise InvalidOption(f"{name} must be {'positive' if positive else 'zero or more'}, not {value!r}")


def _parameters(fn: Callable[..., Any]) -> Optional[dict[str, inspect.Parameter]]:
    try:
        return dict(inspect.signature(fn).parameters)
    except (TypeError, ValueError):  # builtins and some C callables have no signature
        return None


def check_args_spec(name: str, spec: ArgsSpec, fn: Callable[..., Any]) -> None:
    """Validate a ``unique_args``/``concurrency_key`` value against the actor's function."""
    if spec is None or spec is True or callable(spec):
        return
    if spec is False:
        raise InvalidOption(f"{name} must be a list of parameter names, True or a callable, not False")
    if isinstance(spec, str) or not isinstance(spec, (list, tuple)):
        raise InvalidOption(f"{name} must be a list of parameter names, True or a callable, not {spec!r}")
    params = _parameters(fn)
    if params is None:
        return
    for arg in spec:
        if not isinstance(arg, str):
            raise InvalidOption(f"{name} entries must be parameter names, not {arg!r}")
        if arg not in params:
            raise InvalidOption(f"{name} names {arg!r}, which {fn.__qualname__}() has no parameter for")


def validate(options: dict, fn: Callable[..., Any]) -> None:
    """Raise :class:`InvalidOption` for any bad suite option value (at declaration or send)."""
    check_args_spec("unique_args", options.get("unique_args"), fn)
    check_args_spec("concurrency_key", options.get("concurrency_key"), fn)
    lock = options.get("unique_lock")
    if lock is not None and lock not in LOCK_TYPES:
        raise InvalidOption(f"unique_lock must be one of {sorted(LOCK_TYPES)}, not {lock!r}")
    conflict = options.get("unique_on_conflict")
    if conflict is not None and conflict not in CONFLICT_STRATEGIES:
        raise InvalidOption(f"unique_on_conflict must be one of {sorted(CONFLICT_STRATEGIES)}, not {conflict!r}")
    order = options.get("unique_order_by")
    if order is not None and order not in ORDER_BY:
        raise InvalidOption(f"unique_order_by must be one of {sorted(ORDER_BY)}, not {order!r}")
    _check_ms("unique_ttl", options.get("unique_ttl"), positive=True)
    _check_ms("unique_window", options.get("unique_window"), positive=True)
    _check_ms("concurrency_ttl", options.get("concurrency_ttl"), positive=True)
    _check_ms("idempotency_window", options.get("idempotency_window"), positive=True)
    limit = options.get("concurrency_limit")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise InvalidOption(f"concurrency_limit must be a whole number, 0 or more, not {limit!r}")
    track = options.get("track")
    if track is not None and not isinstance(track, bool):
        raise InvalidOption(f"track must be True or False, not {track!r}")
    if options.get("unique_args") is None:
        # unique_ttl (the row lease) and unique_order_by (who runs next)
        # also serve tracked and slot-limited actors without uniqueness.
        for name in ("unique_lock", "unique_on_conflict", "unique_window"):
            if options.get(name) is not None:
                raise InvalidOption(f"{name} has no effect without unique_args")
