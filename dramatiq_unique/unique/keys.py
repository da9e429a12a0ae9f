"""Unique keys: the key of one call under ``unique_args`` or ``concurrency_key``, the same in every
process (its canonical form: docs/discussions/how-it-is-built.md, "Sending")."""

from __future__ import annotations

import hashlib
import inspect
import json
from functools import lru_cache
from typing import Any, Callable, Optional

from dramatiq_unique.errors import InvalidOption
from dramatiq_unique.options import ADDRESS, ArgsSpec, show, signature_of


def _default(value: Any) -> Any:
    """The canonical stand-in of a value JSON cannot write (see the module's docstring)."""
    if isinstance(value, (set, frozenset)):
        return {"__set__": sorted(canonical(item) for item in value)}
    text = repr(value)
    if ADDRESS.search(text):
        raise InvalidOption(
            f"an argument of type {type(value).__name__} ({show(value)}) cannot make a unique key: its repr "
            f"holds a memory address, so each process would make another key; give the type a __repr__, "
            f"or choose the key's arguments with unique_args/concurrency_key (a list or a callable)"
        )
    return text


# pottery patches json.dumps to use its own encoder; naming the stock
# encoder keeps our keys independent of whether pottery was imported.
_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"), default=_default, ensure_ascii=False)


@lru_cache(maxsize=1024)
def _plain_parameters(fn: Callable[..., Any]) -> Optional[tuple[tuple[str, ...], dict[str, Any]]]:
    """(names, defaults) when every parameter is plain positional-or-keyword (the common case, bound as a zip
    of names and arguments, much cheaper than ``Signature.bind``), else None."""
    signature = signature_of(fn)
    if signature is None:
        return None
    params = list(signature.parameters.values())
    if any(p.kind is not inspect.Parameter.POSITIONAL_OR_KEYWORD for p in params):
        return None
    defaults = {p.name: p.default for p in params if p.default is not inspect.Parameter.empty}
    return tuple(p.name for p in params), defaults


def bind_arguments(fn: Callable[..., Any], args: tuple, kwargs: dict) -> dict[str, Any]:
    """The call's arguments by parameter name, defaults filled in."""
    plain = _plain_parameters(fn)
    if plain is not None:
        names, defaults = plain
        # A missing, repeated or unknown argument goes on to inspect, which says which.
        if len(args) <= len(names) and (not kwargs or kwargs.keys() <= set(names[len(args) :])):
            bound = dict(zip(names, args, strict=False), **kwargs)
            if len(bound) < len(names):
                bound = {**defaults, **bound}
            if len(bound) == len(names):
                return {name: bound[name] for name in names}  # in declaration order, as inspect does
    signature = signature_of(fn)
    if signature is None:
        return {**{str(i): a for i, a in enumerate(args)}, **kwargs}
    try:
        bound_args = signature.bind(*args, **kwargs)
    except TypeError as e:
        raise InvalidOption(f"the arguments do not fit {getattr(fn, '__qualname__', fn)}(): {e}") from None
    bound_args.apply_defaults()
    return dict(bound_args.arguments)


def canonical(value: Any) -> str:
    """A stable text form of ``value``: dict order and tuple/list do not matter."""
    try:
        return _ENCODER.encode(value)
    except TypeError:
        # A dict whose keys sort_keys cannot order (mixed types) or JSON cannot write (tuples).
        return _ENCODER.encode(_ordered(value))


def _ordered(value: Any) -> Any:
    """``value`` with every dict whose keys are not all str as its items, sorted by key text."""
    if isinstance(value, dict):
        if all(type(k) is str for k in value):
            return {k: _ordered(v) for k, v in value.items()}
        # Keys of a dict are distinct, and so are their canonical texts: the sort never compares values.
        return {"__items__": sorted([canonical(k), _ordered(v)] for k, v in value.items())}
    if isinstance(value, (list, tuple)):
        return [_ordered(item) for item in value]
    return value


def digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:40]


def derive_key(actor_name: str, fn: Callable[..., Any], spec: ArgsSpec, args: tuple, kwargs: dict) -> Optional[str]:
    """The key of one call under ``spec`` (``unique_args`` or ``concurrency_key``), or None if off."""
    if spec is None or spec is False:
        return None
    if callable(spec) and not isinstance(spec, (list, tuple)):
        selected: Any = spec(*args, **kwargs)
        if not isinstance(selected, str):
            raise InvalidOption(f"the key callable for {actor_name} must return a str, not {selected!r}")
    else:
        bound = bind_arguments(fn, args, kwargs)
        selected = bound if spec is True else {name: bound.get(name) for name in spec}
    return f"{actor_name}:{digest(canonical(selected))}"


def idempotency_hold(actor_name: str, owner: Optional[str], idempotency_key: str) -> str:
    """What a job holds for its ``(actor, owner, idempotency_key)``; hashed like unique keys."""
    return f"{actor_name}:{digest(canonical([owner, idempotency_key]))}"
