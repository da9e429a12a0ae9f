"""Keys in words: ``customer=42``, rendered from a job's row and its actor's options.

Redis keys and ``parked_on`` hold only a hash of the selected arguments
(:mod:`dramatiq_unique.unique.keys`): no user data sits in Redis.  The row
keeps the arguments, so an operator's view binds them again, as the send
did (:func:`~dramatiq_unique.unique.keys.bind_arguments`), and names the
parameters that ``unique_args`` or ``concurrency_key`` select.  A key
callable is called on the row's arguments (it ran at the send, so it is
pure); one that raises, returns no str or is slow is shown as its hash.
"""

from __future__ import annotations

import inspect
import json
import time
import weakref
from typing import TYPE_CHECKING, Any, Callable, Optional

from dramatiq_unique.unique.keys import bind_arguments, canonical, digest

if TYPE_CHECKING:
    from dramatiq_unique.storage.models import JobModel
    from dramatiq_unique.suite import ActorConfig

#: ms a key callable may take before it is shown as its hash from then on (in this process).
SLOW_CALLABLE_MS = 20
#: Characters of a rendered value kept (a long argument is cut, with an ellipsis).
MAX_VALUE = 60
#: Characters of a hash shown when there are no words for it.
SHORT_HASH = 12

# Key callables found slow; weakly held, so that a new callable never inherits a dead one's verdict
# through a reused id().
_slow: "weakref.WeakSet[Any]" = weakref.WeakSet()


def value_text(value: Any) -> str:
    """One argument's value in words: a str bare (``acme``), the rest as JSON (``42``, ``[1,2]``)."""
    text = value if isinstance(value, str) else canonical(value)
    return text if len(text) <= MAX_VALUE else text[: MAX_VALUE - 1] + "…"


def selected_text(selected: dict[str, Any]) -> str:
    """``{"customer": 42, "region": "eu"}`` as ``customer=42 region=eu``."""
    return " ".join(f"{name}={value_text(value)}" for name, value in selected.items())


def short(key: Optional[str]) -> str:
    """A hashed key (``actor:0ef2770d…``) cut to its first characters: ``#0ef2770d1a2b``."""
    if not key:
        return ""
    return "#" + key.rsplit(":", 1)[-1][:SHORT_HASH]


def signature(fn: Callable[..., Any]) -> Optional[inspect.Signature]:
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):
        return None


def _call(spec: Callable[..., Any], args: list, kwargs: dict) -> Optional[str]:
    try:
        if spec in _slow:
            return None
    except TypeError:  # a callable that takes no weak reference is never remembered as slow
        pass
    began = time.monotonic()
    try:
        result = spec(*args, **kwargs)
    except Exception:  # the operator's view must not fail on a user's callable: the hash is shown
        return None
    if (time.monotonic() - began) * 1000 > SLOW_CALLABLE_MS:
        try:
            _slow.add(spec)
        except TypeError:
            pass
    return result if isinstance(result, str) else None


def render(config: Optional["ActorConfig"], option: str, row: "JobModel", hashed: Optional[str] = None) -> str:
    """The key ``option`` (``unique_args`` or ``concurrency_key``) gives ``row``, in words.

    ``hashed`` is the key as stored (a unique key, a slot group key), shown cut short when
    there are no words for it: the actor is not declared in this process, or the
    arguments no longer bind.  '' when the option is off.
    """
    if config is None:
        return short(hashed)
    spec = getattr(config.for_message(row.options or {}), option)
    if spec is None or spec is False:
        return ""
    args, kwargs = list(row.args or []), dict(row.kwargs or {})
    if callable(spec) and not isinstance(spec, (list, tuple)):
        text = _call(spec, args, kwargs)
        return short(hashed) if text is None else value_text(text)
    try:
        bound = bind_arguments(config.fn, tuple(args), kwargs)
    except Exception:  # arguments of an older signature: the hash is all there is
        return short(hashed)
    selected = bound if spec is True else {name: bound.get(name) for name in spec}
    return selected_text(selected)


def row_key(config: Optional["ActorConfig"], row: "JobModel") -> str:
    """A row's key in words: its unique key's, else its slot group's; '' if it has neither."""
    if row.unique_key or (config is not None and config.options.get("unique_args") is not None):
        text = render(config, "unique_args", row, row.unique_key)
        if text:
            return text
    if config is not None:
        return render(config, "concurrency_key", row)
    return ""


def parse(text: str) -> dict[str, Any]:
    """``customer=42 region=eu`` as ``{"customer": 42, "region": "eu"}`` (a value JSON reads is
    taken as JSON, else as a str); ValueError for a word without ``=``."""
    selected: dict[str, Any] = {}
    for word in text.split():
        name, sep, value = word.partition("=")
        if not sep or not name:
            raise ValueError(f"a key is name=value words, such as customer=42, not {word!r}")
        try:
            selected[name] = json.loads(value)
        except ValueError:
            selected[name] = value
    return selected


def candidate_keys(config: "ActorConfig", option: str, text: str) -> Optional[list[str]]:
    """The hashed keys (``<actor>:<digest>``) whose words are ``text``, when ``option`` names
    exactly those parameters; None when they cannot be derived (a callable, True, other names)."""
    spec = config.options.get(option)
    if not isinstance(spec, (list, tuple)):
        return None
    selected = parse(text)
    if set(selected) != set(spec):
        return None
    # "42" may have been sent as the int or the str: both are asked for.
    variants: list[dict[str, Any]] = [{}]
    for name in spec:
        value = selected[name]
        choices = [value] if isinstance(value, str) else [value, value_text(value)]
        variants = [{**v, name: c} for v in variants for c in choices]
    return sorted({f"{config.actor_name}:{digest(canonical(v))}" for v in variants})


def limit_key(config: "ActorConfig", text: str) -> Any:
    """The ``key`` that :func:`~dramatiq_unique.set_concurrency_limit` takes, from its words:
    the text itself for a callable ``concurrency_key``; ``{"customer": 42}`` for ``customer=42``;
    a bare value (``42``, ``acme``) for an actor whose key names one parameter."""
    spec = config.options.get("concurrency_key")
    if callable(spec) and not isinstance(spec, (list, tuple)):
        return text
    if "=" in text:
        return parse(text)
    try:
        return json.loads(text)
    except ValueError:
        return text
