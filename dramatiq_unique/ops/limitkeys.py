"""The slot group a run-time limit is set on, as an operator names it: words, a value, or a hash.

``limit APP deliver customer=42 3`` and the dashboard's forms name a group so; the limit is
set on the group's key (``<actor>:<digest>``) that a job with those arguments gets, as the
worker derives it (:func:`~dramatiq_unique.slots.limits.key_group`):

* words (``customer=42``), or a bare value for a key of one parameter (``42``).  A value
  that JSON reads may have been sent as that value or as its text (``"42"``): the
  parameter's type hint decides, else a group some job of the actor has had, else the value
  as JSON reads it.  A value the hint rules out (``customer=typo`` for ``customer: int``)
  names a group no job can have: refused.  A key no job has had yet is accepted with a
  warning (the limit waits for the jobs that will have it).
* ``#`` and the start of a group's hash, as the views show a group whose words are not
  known: the one group of the actor the app knows (a kept limit, holders in Redis, parked
  jobs) whose hash starts so.
* ``(all)``, or no key: the actor's own limit.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import types
import typing
from typing import TYPE_CHECKING, Any, Optional

from dramatiq_unique.errors import InvalidOption
from dramatiq_unique.ops import held, keyfilter, labels
from dramatiq_unique.parking.groups import whole_actor
from dramatiq_unique.slots.gate import group_key
from dramatiq_unique.slots.limits import key_group, key_words

if TYPE_CHECKING:
    from dramatiq_unique.suite import ActorConfig, Suite

#: What names the actor's own limit.
ALL = "(all)"
#: Hex digits of a hash an operator must give at least.
MIN_HASH = 4
#: The newest rows of the actor read to learn which groups its jobs have had.
SEEN_ROWS = 1_000


@dataclasses.dataclass(frozen=True)
class Target:
    """Where a limit goes: ``group`` '' for the actor's own, else a group's key; its words and key
    value to keep with it (None when named by its hash); a warning to show, or ''."""

    group: str
    words: Optional[str] = None
    key: Any = None
    warning: str = ""


def resolve(suite: "Suite", config: "ActorConfig", text: Optional[str]) -> Target:
    """The target ``text`` names for ``config``'s actor (see the module docstring); InvalidOption when
    it names none, or names a group no job of the actor can have."""
    text = (text or "").strip()
    if not text or text == ALL:
        return Target("")
    if config.options.get("concurrency_key") is None:
        raise InvalidOption(f"actor {config.actor_name!r} has no concurrency_key: its limit takes no key")
    if text.startswith("#"):
        return Target(by_hash(suite, config, text))
    values = candidates(config, text)
    fitting = [value for value in values if _fits(config, value)]
    if not fitting:
        raise InvalidOption(f"no job of {config.actor_name!r} can have the key {text!r}: {_hint_text(config)}")
    seen = seen_groups(suite, config, text)
    chosen = next((value for value in fitting if key_group(config, value) in seen), fitting[0])
    group = key_group(config, chosen)
    warning = "" if group in seen else (
        f"no job of {config.actor_name} has had the key {key_words(config, chosen)} yet: the limit is kept for "
        f"the jobs that will (remove it with: limit {config.actor_name} '{key_words(config, chosen)}' default)")
    return Target(group, key_words(config, chosen), chosen, warning)


def named_groups(suite: "Suite", config: "ActorConfig", text: str) -> set[str]:
    """Every group ``text`` may name, whatever jobs have had (the dashboard's check that a form's words
    and group agree); '' for the actor's own."""
    text = text.strip()
    if not text or text == ALL:
        return {"", whole_actor(config.actor_name)} if config.options.get("concurrency_key") is None else {""}
    if text.startswith("#"):
        try:
            return {by_hash(suite, config, text)}
        except InvalidOption:
            return set()
    found = set()
    for value in candidates(config, text):
        try:
            found.add(key_group(config, value))
        except InvalidOption:
            continue
    return found


def candidates(config: "ActorConfig", text: str) -> list[Any]:
    """The key values ``text`` may mean, the JSON reading first (InvalidOption for words that name
    other parameters than the key's)."""
    spec = config.options.get("concurrency_key")
    if callable(spec) and not isinstance(spec, (list, tuple)):
        return [text]
    if "=" not in text:
        if not isinstance(spec, (list, tuple)) or len(spec) != 1:
            raise InvalidOption(f"the key of {config.actor_name!r} is name=value words: {_names(spec)}")
        text = f"{spec[0]}={text}"
    try:
        parsed = labels.parse(text)
    except ValueError as e:
        raise InvalidOption(str(e)) from None
    wanted = set(spec) if isinstance(spec, (list, tuple)) else None
    if wanted is not None and set(parsed) != wanted:
        raise InvalidOption(f"the key of {config.actor_name!r} names {_names(spec)}, not {' '.join(sorted(parsed))}")
    options: list[dict[str, Any]] = [{}]
    for name, value in parsed.items():
        choices = [value] if isinstance(value, str) else [value, _text(value)]
        options = [{**o, name: c} for o in options for c in choices]
    if isinstance(spec, (list, tuple)) and len(spec) == 1:
        return [o[spec[0]] for o in options]  # set_concurrency_limit's key=42 for a key of one parameter
    return list(options)


def by_hash(suite: "Suite", config: "ActorConfig", text: str) -> str:
    """The one known group of the actor whose hash starts with ``text`` (``#0ef2770d``)."""
    start = text[1:].strip().lower()
    if len(start) < MIN_HASH or any(c not in "0123456789abcdef" for c in start):
        raise InvalidOption(f"a group's hash is # and at least {MIN_HASH} hex digits, as the views show it, "
                            f"not {text[:50]!r}")
    known = [g for g in held.known_groups(suite) if g.rsplit(":", 1)[0] == config.actor_name]
    found = sorted({g for g in known if g.rsplit(":", 1)[1].startswith(start)})
    if not found:
        raise InvalidOption(f"no slot group of {config.actor_name!r} has the hash {text[:50]!r} (`slots` and "
                            f"`limits` show them)")
    if len(found) > 1:
        raise InvalidOption(f"{text!r} names {len(found)} groups of {config.actor_name!r}: give more of the hash")
    return found[0]


def seen_groups(suite: "Suite", config: "ActorConfig", text: str) -> set[str]:
    """Groups of the actor that jobs have had: its newest rows whose arguments may hold the key (a
    bounded number), holders in Redis, parked jobs (a limit set for a group is no job of it)."""
    table = config.model
    mine = (table.app == suite.app) & (table.actor_name == config.actor_name)
    query = table.select().where(mine & keyfilter.sieve(suite, table, text, config.actor_name))
    seen = {g for g in held.known_groups(suite, limits=False) if g.rsplit(":", 1)[0] == config.actor_name}
    for row in query.order_by(table.id.desc()).limit(SEEN_ROWS):
        try:
            seen.add(group_key(config, row.options or {}, tuple(row.args or ()), dict(row.kwargs or {})))
        except Exception:  # arguments of an older signature: no group
            continue
    return seen


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _names(spec: Any) -> str:
    return " ".join(f"{name}=..." for name in spec) if isinstance(spec, (list, tuple)) else "the callable's str"


def _hints(config: "ActorConfig") -> dict[str, Any]:
    try:
        return typing.get_type_hints(config.fn)
    except Exception:  # hints that do not evaluate: none to go by
        return {}


def _types(hint: Any) -> Optional[tuple[type, ...]]:
    """The plain types a hint allows (``Optional[int]``: int and None), or None when it is not only
    plain types (``Any``, a class of the app's): then any value may fit."""
    plain = (int, float, str, bool, type(None), list, dict)
    if hint in plain:
        return (hint,)
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        found: list[type] = []
        for arg in typing.get_args(hint):
            sub = _types(arg)
            if sub is None:
                return None
            found += sub
        return tuple(found)
    origin = typing.get_origin(hint)
    return (origin,) if origin in (list, dict) else None


def _value_fits(value: Any, allowed: tuple[type, ...]) -> bool:
    if isinstance(value, bool):
        return bool in allowed
    if isinstance(value, int):
        return int in allowed or float in allowed
    return isinstance(value, allowed)


def _fits(config: "ActorConfig", value: Any) -> bool:
    """Whether a job can be sent with ``value`` as its key, by the parameters' type hints."""
    spec = config.options.get("concurrency_key")
    if not isinstance(spec, (list, tuple)) and spec is not True:
        return True
    if isinstance(value, dict):
        selected = value
    elif isinstance(spec, (list, tuple)) and len(spec) == 1:
        selected = {spec[0]: value}
    else:
        return True
    hints = _hints(config)
    for name, item in selected.items():
        allowed = _types(hints.get(name, inspect.Parameter.empty))
        if allowed is not None and not _value_fits(item, allowed):
            return False
    return True


def _hint_text(config: "ActorConfig") -> str:
    spec = config.options.get("concurrency_key")
    hints = _hints(config)
    names = spec if isinstance(spec, (list, tuple)) else list(hints)
    said = [f"{name}: {getattr(hints[name], '__name__', hints[name])}" for name in names if name in hints]
    return f"{config.actor_name}({', '.join(said)})" if said else "its parameters' type hints rule it out"
