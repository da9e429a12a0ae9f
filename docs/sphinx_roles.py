"""A griffe extension for the API page: the docstrings' Sphinx roles as Markdown.

The package's docstrings name other objects the Sphinx way (:func:`get_job`,
:class:`~dramatiq_unique.errors.LockLost`), which mkdocstrings would print as is.  A
public name (one of ``dramatiq_unique.__all__``, rendered on the API page) becomes a
link to its entry; any other name becomes code.  A placeholder such as ``<key_prefix>``
in plain text is escaped, so that Markdown shows it rather than hide it as a tag.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

import griffe

ROLE = re.compile(r":(?:func|class|mod|meth|attr|data|exc|obj):`(~?)([\w.]+)`")
#: A placeholder such as <key_prefix>, which Markdown would take for an HTML tag and hide.
PLACEHOLDER = re.compile(r"<([a-z_]+)>")


def public_names() -> set[str]:
    """``dramatiq_unique.__all__``, read from the checkout's source (importing the package would
    import Dramatiq, Redis and peewee for a docs build, and maybe another checkout's copy)."""
    init = Path(__file__).resolve().parents[1] / "dramatiq_unique" / "__init__.py"
    for node in ast.parse(init.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            return set(ast.literal_eval(node.value))
    raise LookupError(f"no __all__ in {init}")


PUBLIC = public_names()


def markdown(match: re.Match) -> str:
    short, path = match.group(1), match.group(2)
    shown = path.rsplit(".", 1)[-1] if short else path
    name = path.rsplit(".", 1)[-1]
    if name in PUBLIC:
        return f"[`{shown}`][dramatiq_unique.{name}]"
    return f"`{shown}`"


def placeholders(text: str) -> str:
    """``<name>`` outside code spans written as text (inside them Markdown shows it as is)."""
    parts = text.split("`")
    parts[::2] = [PLACEHOLDER.sub(r"&lt;\1&gt;", part) for part in parts[::2]]
    return "`".join(parts)


class SphinxRoles(griffe.Extension):
    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = placeholders(ROLE.sub(markdown, obj.docstring.value))
