"""Our Lua scripts, one file each under ``redis/lua/`` (its header says its keys, arguments, reply and
why it is safe to send again), read once, fragments (``_name.lua``) taken in by ``-- #include``."""

from __future__ import annotations

import functools
import re
from importlib import resources
from typing import TYPE_CHECKING

import redis

from dramatiq_unique.redis import scripts

if TYPE_CHECKING:
    from importlib.resources.abc import Traversable

#: Replies of the scripts that leave a gate unless a waiter was flagged
#: (lock_release_unless.lua, slot_leave.lua): not held, released, kept for a waiter.
NOT_HELD, RELEASED, KEPT = 0, 1, 2
#: The package whose ``lua`` folder holds the scripts.
PACKAGE = "dramatiq_unique.redis"
#: A line that takes in a fragment: ``-- #include _name.lua``.
INCLUDE = re.compile(r"^-- #include (\w+)\.lua$", re.MULTILINE)


def _folder() -> "Traversable":
    return resources.files(PACKAGE) / "lua"


def names() -> list[str]:
    """The name of every script and fragment (a fragment's starts with ``_``), sorted."""
    return sorted(entry.name[:-4] for entry in _folder().iterdir() if entry.name.endswith(".lua"))


@functools.cache
def file_text(name: str) -> str:
    """The text of ``lua/<name>.lua`` as it is on disk."""
    return (_folder() / f"{name}.lua").read_text(encoding="utf-8")


def _code(text: str) -> str:
    """``text`` without its header: the comments and blank lines it opens with."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.strip() and not line.startswith("--")), len(lines))
    return "\n".join(lines[start:])


@functools.cache
def source(name: str) -> str:
    """The text of the script ``name`` as Redis runs it: its file, fragments taken in."""
    return INCLUDE.sub(lambda line: _code(source(line.group(1))), file_text(name))


def register(client: redis.Redis, name: str) -> scripts.Script:
    """The script ``name`` (``lua/<name>.lua``) on ``client``, called like redis-py's ``Script``."""
    return scripts.Script(client, source(name))
