"""Readable tables for a terminal: aligned columns, cut cells, times to the second, no raw control characters."""

from __future__ import annotations

import json as jsonlib
from typing import Any, Iterable, Optional, Sequence

from dramatiq_unique.ops.words import MAX_DETAIL, duration, one_line

#: Characters of a cell kept (a longer one is cut, with an ellipsis).
MAX_CELL = 48
#: The control characters a text of several lines keeps (``visible(text, keep=LINES)``).
LINES = "\n\t"


def visible(text: str, *, keep: str = "", json: bool = False) -> str:
    """``text`` with every character a terminal would act on rather than show (``str.isprintable``:
    ESC, C1, CR, backspace, bidi overrides) written out as an escape, but those in ``keep``;
    ``json=True``: as JSON escapes (``json.dumps`` leaves DEL, C1 and bidi characters raw)."""
    if text.isprintable() or all(c.isprintable() or c in keep for c in text):
        return text
    out = []
    for c in text:
        if c.isprintable() or c in keep:
            out.append(c)
        elif json:  # its \u escape (a pair of surrogates past U+FFFF), as JSON writes it
            out.append(jsonlib.dumps(c)[1:-1])
        else:
            out.append(c.encode("unicode_escape").decode("ascii"))
    return "".join(out)


def cell(value: Any) -> str:
    return visible(one_line(value, MAX_CELL, none="-"))


def detail(text: str) -> str:
    """A value shown whole on a view of one job, cut only past :data:`MAX_DETAIL` characters."""
    if len(text) <= MAX_DETAIL:
        return text
    return f"{text[:MAX_DETAIL]}… ({len(text) - MAX_DETAIL} characters more: --json prints them all)"


def ms(value: Optional[float]) -> str:
    return "-" if value is None else duration(value)


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]], *, empty: str = "(none)") -> str:
    """``rows`` under ``headers``, in columns two spaces apart; ``empty`` if there are no rows."""
    body = [[cell(v) for v in row] for row in rows]
    if not body:
        return empty
    widths = [max(len(h), *(len(r[i]) for r in body)) for i, h in enumerate(headers)]
    lines = ["  ".join(h.upper().ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in body]
    return "\n".join(lines)


def pairs(items: Iterable[tuple[str, Any]]) -> str:
    """``name: value`` lines, the names aligned (a value of several lines keeps its own)."""
    items = list(items)
    width = max((len(name) for name, _ in items), default=0)
    shown = [(name, visible(v, keep=LINES) if isinstance(v, str) else cell(v)) for name, v in items]
    return "\n".join(f"{name.ljust(width)}  {v}" for name, v in shown)
