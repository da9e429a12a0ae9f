"""Our Lua scripts, one file each under ``redis/lua/`` (its header says its keys, arguments, reply and
why it is safe to send again), read once, fragments (``_name.lua``) taken in by ``-- #include``."""

from __future__ import annotations

import functools
import re
from importlib import resources

import redis

from dramatiq_unique.redis import scripts

#: Replies of the scripts that leave a gate unless a waiter was flagged
#: (lock_release_unless.lua, slot_leave.lua): not held, released, kept for a waiter.
NOT_HELD, RELEASED, KEPT = 0, 1, 2
#: The package whose ``lua`` folder holds the scripts (shipped as package data: read through importlib.resources).
PACKAGE = "dramatiq_unique.redis"
#: A line that takes in a fragment: ``-- #include _name.lua``.
INCLUDE = re.compile(r"^-- #include (\w+)\.lua$", re.MULTILINE)


@functools.cache
def file_text(name: str) -> str:
    """The text of ``lua/<name>.lua`` as it is on disk."""
    return (resources.files(PACKAGE) / "lua" / f"{name}.lua").read_text(encoding="utf-8")


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
