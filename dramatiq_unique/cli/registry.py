"""The commands, by name: one function each, registered with :func:`command`.

Adding a command is one module ``dramatiq_unique/cli/cmd_<topic>.py`` (every
such module is imported when the command line starts, see ``__init__``)::

    from dramatiq_unique.cli.registry import Context, command

    @command("status", help="the schema version of every job table",
             arguments=lambda p: p.add_argument("--verbose", action="store_true"))
    def status(ctx: Context, args) -> int:
        suite = ctx.load()            # the app's suite, or one from the environment (read-only)
        ctx.emit({"version": 3}, lambda: "version 3")
        return 0                      # 0 done, 1 not done (refused, not found), 2 not understood

``writes=True`` marks a command that changes state: it is refused (exit 1) when
the suite comes from the environment instead of the app.  ``positionals`` names
the command's own positional words (``"[KEY]"`` for an optional one); the app
module may come before them (``job myapp.tasks 17`` or, from the environment,
``job 17``), or be given as ``--app``.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any, Callable, Optional

from dramatiq_unique.cli.context import Context

Run = Callable[[Context, argparse.Namespace], int]


@dataclasses.dataclass(frozen=True)
class Command:
    name: str
    help: str
    run: Run
    #: Adds the command's options to its parser.
    arguments: Optional[Callable[[argparse.ArgumentParser], Any]] = None
    #: The command's own positional words, in order; "[NAME]" for an optional one.
    positionals: tuple[str, ...] = ()
    #: Changes state: refused without the app (a suite from the environment is read-only).
    writes: bool = False
    #: Load the suite before ``run`` (False: the command calls ``ctx.load()`` itself, if at all).
    load: bool = True

    @property
    def least(self) -> int:
        return sum(1 for p in self.positionals if not p.startswith("["))

    @property
    def most(self) -> int:
        return len(self.positionals)


COMMANDS: dict[str, Command] = {}


def command(
    name: str, *, help: str, arguments: Optional[Callable[[argparse.ArgumentParser], Any]] = None,
    positionals: tuple[str, ...] = (), writes: bool = False, load: bool = True,
) -> Callable[[Run], Run]:
    """Register the decorated function as the command ``name`` (see the module's docstring)."""
    def register(run: Run) -> Run:
        if name in COMMANDS and COMMANDS[name].run is not run:
            raise ValueError(f"two commands named {name!r}")
        COMMANDS[name] = Command(name, help, run, arguments, positionals, writes, load)
        return run

    return register


def split_words(
    cmd: Command, words: list[str], looks_like_app: Callable[[str], bool],
) -> tuple[Optional[str], list[str]]:
    """``(app, the command's own words)`` from the positional words after the command's name.

    One word more than the command takes makes the first the app; as many as it takes at
    least, none; in between (an optional word), the first is the app if it looks like one
    (``module:attribute``, or a module that can be found).  ValueError for too many or too few.
    """
    if len(words) > cmd.most + 1 or len(words) < cmd.least:
        want = " ".join(cmd.positionals) or "no words"
        raise ValueError(f"{cmd.name} takes [APP] {want}, not {' '.join(words) or 'nothing'}")
    if len(words) == cmd.most + 1:
        return words[0], words[1:]
    if len(words) == cmd.least or not words:
        return None, words
    return (words[0], words[1:]) if looks_like_app(words[0]) else (None, words)
