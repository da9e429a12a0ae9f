"""The ``key`` filter of the jobs list: words such as ``customer=42`` matched against job rows.

Three ways, cheapest first: words that hash back to the actor's unique keys use the
``unique_key`` index (:func:`derived`); otherwise a sieve in SQL keeps the rows whose stored
arguments hold each value as a whole value (:func:`sieve`), and Python decides by rendering
each row's key in words (:func:`matches`, :mod:`dramatiq_unique.ops.labels`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

import peewee as pw

from dramatiq_unique.ops import labels
from dramatiq_unique.storage.models import JobModel

if TYPE_CHECKING:
    from dramatiq_unique.suite import Suite


def normal(text: str) -> Any:
    try:
        return labels.parse(text)
    except ValueError:
        return text.strip()


def derived(suite: "Suite", actor: Optional[str], key: str) -> Optional[tuple[str, ...]]:
    """The unique keys ``key`` names, when the rows of every actor it can be of are found by them;
    None when some must be matched row by row (:func:`sieve`, :func:`matches`).

    An actor whose ``unique_args`` names exactly the key's parameters gives its hashed keys; one
    whose options name other parameters has no row these words can match, and is left out; one
    whose key is a callable or ``True``, or whose ``concurrency_key`` names these parameters,
    needs the scan.  Without ``actor``, only the actors this process declares can match: the
    rows of others show their hash, which no words match.
    """
    try:
        names = set(labels.parse(key))
    except ValueError:
        return None  # a callable's text or a hash: matched row by row
    configs = [suite.actor_config(actor)] if actor else list(suite.actors.values())
    found: list[str] = []
    for config in configs:
        if config is None:
            return None
        keys = labels.candidate_keys(config, "unique_args", key)
        if keys is not None:
            found += keys
            continue
        for option in ("unique_args", "concurrency_key"):
            spec = config.options.get(option)
            if spec is True or (callable(spec) and not isinstance(spec, (list, tuple))):
                return None
            if isinstance(spec, (list, tuple)) and set(spec) == names:
                return None  # its rows may match by their slot group's key
    return tuple(found)


#: What separates values in the stored JSON (compact: no spaces); each becomes "," for the sieve.
_SEPARATORS = "[]{}:"


def _tokens(column: Any) -> Any:
    """``column`` with every JSON separator made a comma: each value then sits between commas."""
    expr = pw.fn.REPLACE(column, "[", ",")
    for sep in _SEPARATORS[1:]:
        expr = pw.fn.REPLACE(expr, sep, ",")
    return expr


def _defaulted(suite: "Suite", actor: Optional[str], name: str) -> bool:
    """Whether an actor the key may be of gives parameter ``name`` a default (a row sent without it
    holds no value to find)."""
    configs = [suite.actor_config(actor)] if actor else list(suite.actors.values())
    for config in configs:
        if config is None:
            return True
        signature = labels.signature(config.fn)
        param = signature.parameters.get(name) if signature is not None else None
        if param is not None and param.default is not param.empty:
            return True
    return False


def sieve(suite: "Suite", table: type[JobModel], key: Optional[str], actor: Optional[str]) -> Any:
    """A cheap first sieve in SQL: each value of the key's words is a whole value in the stored
    arguments (a number also as its string).  Python decides after it (:func:`matches`)."""
    cond: Any = pw.SQL("1 = 1")
    try:
        selected = labels.parse(key or "")
    except ValueError:
        return cond  # a key callable's text: nothing of it need be in the arguments
    for name, value in selected.items():
        if _defaulted(suite, actor, name):
            continue
        forms = [labels.canonical(value)] + ([] if isinstance(value, str) else [labels.canonical(str(value))])
        found: Any = None
        for form in forms:
            text = "," + "".join("," if c in _SEPARATORS else c for c in form) + ","
            if "%" in text or "_" in text or "\\" in text:
                found = None  # LIKE would read them as wildcards (and SQLite has no default escape)
                break
            one = _like(_tokens(table.args), text) | _like(_tokens(table.kwargs), text)
            found = one if found is None else found | one
        if found is not None:
            cond &= found
    return cond


def _like(column: Any, text: str) -> Any:
    """``column LIKE '%text%'``, the text as it is (peewee would JSON-encode it for a JSON column,
    and make SQLite's LIKE a GLOB)."""
    return pw.NodeList((column, pw.SQL("LIKE"), pw.Value(f"%{text}%", converter=False)))


def matches(suite: "Suite", row: JobModel, key: str) -> bool:
    return normal(labels.row_key(suite.actor_config(row.actor_name), row)) == normal(key)
