"""Keys as an operator names them in words: the jobs list's ``key`` filter (words matched against job
rows, through the ``unique_key`` index when they hash back to unique keys) and the slot group a
run-time limit is set on (words, a bare value, a ``#hash``, or ``(all)``)."""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import operator
import types
import typing
from typing import Any, Callable, Optional

import peewee as pw

from dramatiq_unique.errors import InvalidOption
from dramatiq_unique.ops import held
from dramatiq_unique.ops.words import row_key, value_text
from dramatiq_unique.options import signature_of
from dramatiq_unique.parking.groups import whole_actor
from dramatiq_unique.slots.limits import key_group, key_words
from dramatiq_unique.storage.models import JobModel
from dramatiq_unique.suite import ActorConfig, Suite
from dramatiq_unique.unique.keys import canonical, digest

#: What names the actor's own limit.
ALL = "(all)"
#: Hex digits of a hash an operator must give at least.
MIN_HASH = 4
#: The newest rows of the actor read to learn which groups its jobs have had.
SEEN_ROWS = 1_000
#: What separates values in the stored JSON (compact: no spaces); each becomes "," for the sieve.
_SEPARATORS = "[]{}:"


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


def _readings(selected: dict[str, Any], text: Callable[[Any], str]) -> list[dict[str, Any]]:
    """Every way ``selected`` may have been sent: a value JSON reads as itself, or as its text."""
    choices = [[value] if isinstance(value, str) else [value, text(value)] for value in selected.values()]
    return [dict(zip(selected, chosen, strict=True)) for chosen in itertools.product(*choices)]


def normal(text: str) -> Any:
    try:
        return parse(text)
    except ValueError:
        return text.strip()


def derived(suite: "Suite", actor: Optional[str], key: str) -> Optional[tuple[str, ...]]:
    """The unique keys ``key`` names, when the rows of every actor it can be of are found by them;
    None when some must be matched row by row (:func:`sieve`, :func:`matches`).  Without ``actor``,
    only the actors declared here can match: the rows of others show their hash."""
    try:
        selected = parse(key)
    except ValueError:
        return None  # a callable's text or a hash: matched row by row
    names, found = set(selected), set()
    for config in [suite.actor_config(actor)] if actor else list(suite.actors.values()):
        if config is None:
            return None
        spec = config.options.get("unique_args")
        if isinstance(spec, (list, tuple)) and set(spec) == names:  # the hashed keys whose words these are
            found |= {f"{config.actor_name}:{digest(canonical(v))}" for v in _readings(selected, value_text)}
            continue
        for option in ("unique_args", "concurrency_key"):
            spec = config.options.get(option)
            if spec is True or callable(spec):
                return None
            if isinstance(spec, (list, tuple)) and set(spec) == names:
                return None  # its rows may match by their slot group's key
    return tuple(sorted(found))


def _defaulted(suite: "Suite", actor: Optional[str], name: str) -> bool:
    """Whether an actor the key may be of gives parameter ``name`` a default (a row sent without it
    holds no value to find)."""
    for config in [suite.actor_config(actor)] if actor else list(suite.actors.values()):
        if config is None:
            return True
        signature = signature_of(config.fn)
        param = signature.parameters.get(name) if signature is not None else None
        if param is not None and param.default is not param.empty:
            return True
    return False


def sieve(suite: "Suite", table: type["JobModel"], key: Optional[str], actor: Optional[str]) -> Any:
    """A cheap first sieve in SQL: each value of the key's words is a whole value in the stored
    arguments (a number also as its string).  Python decides after it (:func:`matches`)."""
    cond: Any = pw.SQL("1 = 1")
    try:
        selected = parse(key or "")
    except ValueError:
        return cond  # a key callable's text: nothing of it need be in the arguments
    for name, value in selected.items():
        if _defaulted(suite, actor, name):
            continue
        forms = [canonical(value)] + ([] if isinstance(value, str) else [canonical(str(value))])
        texts = ["," + "".join("," if c in _SEPARATORS else c for c in form) + "," for form in forms]
        if any(c in text for text in texts for c in "%_\\"):
            continue  # LIKE would read them as wildcards (and SQLite has no default escape)
        cond &= functools.reduce(operator.or_, [_like(column, text) for text in texts
                                                for column in (table.args, table.kwargs)])
    return cond


def _like(column: Any, text: str) -> Any:
    """``column`` with every JSON separator made a comma (each value then sits between commas) ``LIKE
    '%text%'``, the text as it is (peewee would JSON-encode it for a JSON column, and make SQLite's LIKE a GLOB)."""
    tokens = functools.reduce(lambda expr, sep: pw.fn.REPLACE(expr, sep, ","), _SEPARATORS, column)
    return pw.NodeList((tokens, pw.SQL("LIKE"), pw.Value(f"%{text}%", converter=False)))


def matches(suite: "Suite", row: "JobModel", key: str) -> bool:
    return normal(row_key(suite.actor_config(row.actor_name), row)) == normal(key)


@dataclasses.dataclass(frozen=True)
class Target:
    """Where a limit goes: ``group`` '' for the actor's own, else a group's key; its words and key
    value to keep with it (None when named by its hash); a warning to show, or ''."""

    group: str
    words: Optional[str] = None
    key: Any = None
    warning: str = ""


def limit_target(suite: "Suite", actor: str, text: Optional[str], group: str = "") -> Target:
    """The group ``text`` names for ``actor``; InvalidOption when it names none, or one no job of the actor
    can have.  Whether ``42`` is the int or the str: ``group`` as a page listed it (then ``text``, the key
    as the page showed it, must name it: a forged form is refused), else the type hint, else a group some
    job has had; a key no job has had yet comes with a warning."""
    config = suite.actor_config(actor)
    if config is None:
        raise InvalidOption(f"no actor {actor!r} with concurrency slots is declared in this process")
    text, group = (text or "").strip(), group.strip()
    if group:
        named = named_groups(suite, config, text)
        if group not in named:
            raise InvalidOption(f"no slot group of {actor!r} has the key {text!r}")
        return named[group]
    if not text or text == ALL:
        return Target("")
    if config.options.get("concurrency_key") is None:
        raise InvalidOption(f"actor {actor!r} has no concurrency_key: its limit takes no key")
    if text.startswith("#"):
        return Target(by_hash(suite, config, text))
    fitting = [value for value in candidates(config, text) if _fits(config, value)]
    if not fitting:
        raise InvalidOption(f"no job of {actor!r} can have the key {text!r}: {_hint_text(config)}")
    seen = seen_groups(suite, config, text)
    chosen = next((value for value in fitting if key_group(config, value) in seen), fitting[0])
    group, words = key_group(config, chosen), key_words(config, chosen)
    warning = "" if group in seen else (f"no job of {actor} has had the key {words} yet: the limit is kept for the "
                                        f"jobs that will (remove it with: limit {actor} '{words}' default)")
    return Target(group, words, chosen, warning)


def named_groups(suite: "Suite", config: "ActorConfig", text: str) -> dict[str, Target]:
    """Every group ``text`` may name, whatever jobs have had, and the target each is."""
    if not text or text == ALL:  # the actor's own limit: its one group when it has no key
        return {"": Target(""), **({whole_actor(config.actor_name): Target("")}
                                   if config.options.get("concurrency_key") is None else {})}
    if text.startswith("#"):  # named by its hash: the words kept with its limit stay
        try:
            return {group: Target(group) for group in [by_hash(suite, config, text)]}
        except InvalidOption:
            return {}
    found: dict[str, Target] = {}
    for value in candidates(config, text):
        try:
            group = key_group(config, value)
        except InvalidOption:
            continue
        found.setdefault(group, Target(group, key_words(config, value), value))
    return found


def candidates(config: "ActorConfig", text: str) -> list[Any]:
    """The key values ``text`` may mean, the JSON reading first (InvalidOption for words that name
    other parameters than the key's)."""
    spec = config.options.get("concurrency_key")
    if callable(spec):
        return [text]
    if "=" not in text:
        if not isinstance(spec, (list, tuple)) or len(spec) != 1:
            raise InvalidOption(f"the key of {config.actor_name!r} is name=value words: {_names(spec)}")
        text = f"{spec[0]}={text}"
    try:
        parsed = parse(text)
    except ValueError as e:
        raise InvalidOption(str(e)) from None
    if isinstance(spec, (list, tuple)) and set(parsed) != set(spec):
        raise InvalidOption(f"the key of {config.actor_name!r} names {_names(spec)}, not {' '.join(sorted(parsed))}")
    options = _readings(parsed, functools.partial(json.dumps, separators=(",", ":"), ensure_ascii=False))
    if isinstance(spec, (list, tuple)) and len(spec) == 1:
        return [o[spec[0]] for o in options]  # set_concurrency_limit's key=42 for a key of one parameter
    return options


def _of_actor(groups: list[str], config: "ActorConfig") -> list[str]:
    return [g for g in groups if g.rsplit(":", 1)[0] == config.actor_name]


def by_hash(suite: "Suite", config: "ActorConfig", text: str) -> str:
    """The one known group of the actor whose hash starts with ``text`` (``#0ef2770d``)."""
    start = text[1:].strip().lower()
    if len(start) < MIN_HASH or any(c not in "0123456789abcdef" for c in start):
        raise InvalidOption(f"a group's hash is # and at least {MIN_HASH} hex digits, as the views show it, "
                            f"not {text[:50]!r}")
    found = sorted({g for g in _of_actor(held.known_groups(suite), config) if g.rsplit(":", 1)[1].startswith(start)})
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
    query = table.select().where(mine & sieve(suite, table, text, config.actor_name))
    seen = set(_of_actor(held.known_groups(suite, limits=False), config))
    groups = (held.group_of(config, row) for row in query.order_by(table.id.desc()).limit(SEEN_ROWS))
    return seen | {group for group in groups if group is not None}  # None: a row of an older signature


def _names(spec: Any) -> str:
    return " ".join(f"{name}=..." for name in spec) if isinstance(spec, (list, tuple)) else "the callable's str"


def _hints(config: "ActorConfig") -> dict[str, Any]:
    try:
        return typing.get_type_hints(config.fn)
    except Exception:  # hints that do not evaluate: none to go by
        return {}


def _types(hint: Any) -> Optional[tuple[type, ...]]:
    """The plain types a hint allows (``Optional[int]``: int and None), or None when any value may
    fit (``Any``, a class of the app's)."""
    if hint in (int, float, str, bool, type(None), list, dict):
        return (hint,)
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        allowed = [_types(arg) for arg in typing.get_args(hint)]
        return None if None in allowed else tuple(t for each in allowed if each is not None for t in each)
    return (origin,) if origin in (list, dict) else None


def _fits(config: "ActorConfig", value: Any) -> bool:
    """Whether a job can be sent with ``value`` as its key, by the parameters' type hints."""
    spec = config.options.get("concurrency_key")
    if isinstance(value, dict):
        selected = value
    elif isinstance(spec, (list, tuple)) and len(spec) == 1:
        selected = {spec[0]: value}
    else:
        return True
    hints = _hints(config)
    for name, item in selected.items():
        allowed = _types(hints.get(name))  # None: no hint, any value fits
        # A bool fits a bool only (isinstance() takes it for an int), an int an int or a float.
        exact = (bool,) if isinstance(item, bool) else (int, float) if isinstance(item, int) else None
        if allowed is not None and not (any(t in allowed for t in exact) if exact else isinstance(item, allowed)):
            return False
    return True


def _hint_text(config: "ActorConfig") -> str:
    spec = config.options.get("concurrency_key")
    hints = _hints(config)
    names = spec if isinstance(spec, (list, tuple)) else list(hints)
    said = [f"{name}: {getattr(hints[name], '__name__', hints[name])}" for name in names if name in hints]
    return f"{config.actor_name}({', '.join(said)})" if said else "its parameters' type hints rule it out"
