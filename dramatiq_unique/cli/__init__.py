"""The command line, ``dramatiq-unique COMMAND [APP] [WORDS] [--json]``: the commands by name (each
``cmd_*`` module registers its own with :func:`command`), their words, and one rule of exit codes for
every command: 0 done, 1 understood but not done, 2 not understood (``check``: 0 ok, 1 warning,
2 critical)."""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import os
import pkgutil
import re
import sys
from datetime import datetime, timedelta
from typing import Any, Callable, Optional, Sequence, Union

from dramatiq_unique.cli.context import Context, Refused, Usage, looks_like_app
from dramatiq_unique.durable.dead import since_of
from dramatiq_unique.errors import (
    DependencyUnavailable,
    DramatiqUniqueError,
    InvalidOption,
    JobNotFound,
    JobStateError,
)

__all__ = ["COMMANDS", "Context", "Refused", "Usage", "command", "main"]

EXIT_RULE = ("Exit codes: 0 done; 1 not done: not found, refused, or a store or Redis did not answer; "
             "2 not understood: a bad command, option, word or value (check: 0 ok, 1 warning, 2 critical).")
#: Errors that mean "understood, but not done": exit 1.
REFUSED = (JobNotFound, JobStateError, Refused, DependencyUnavailable)
_AGO = re.compile(r"^(\d+)\s*(ms|s|m|h|d)$")
_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}

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


COMMANDS: dict[str, Command] = {}


def command(
    name: str, *, help: str, arguments: Optional[Callable[[argparse.ArgumentParser], Any]] = None,
    positionals: tuple[str, ...] = (), writes: bool = False, load: bool = True,
) -> Callable[[Run], Run]:
    """Register the decorated function as the command ``name``; it returns the exit code."""
    def register(run: Run) -> Run:
        if name in COMMANDS and COMMANDS[name].run is not run:
            raise ValueError(f"two commands named {name!r}")
        COMMANDS[name] = Command(name, help, run, arguments, positionals, writes, load)
        return run

    return register


def split_words(
    cmd: Command, words: list[str], looks_like_app: Callable[[str], bool],
) -> tuple[Optional[str], list[str]]:
    """``(app, the command's own words)``: one word more than the command takes makes the first the
    app; between its least and its most, the first is the app if it looks like one.  ValueError for
    too many or too few."""
    least, most = sum(1 for p in cmd.positionals if not p.startswith("[")), len(cmd.positionals)
    if len(words) > most + 1 or len(words) < least:
        want = " ".join(cmd.positionals) or "no words"
        raise ValueError(f"{cmd.name} takes [APP] {want}, not {' '.join(words) or 'nothing'}")
    if len(words) == most + 1:
        return words[0], words[1:]
    if len(words) == least or not words:
        return None, words
    return (words[0], words[1:]) if looks_like_app(words[0]) else (None, words)


def since(text: Optional[str]) -> Optional[datetime]:
    """``15m``, ``2h``, ``1d`` (that long ago) or an ISO time (UTC unless it says), as the job table's
    time (naive UTC).  ValueError for anything else."""
    if text is None:
        return None
    text = text.strip()
    ago = _AGO.match(text)
    if ago:
        try:
            return since_of(timedelta(seconds=int(ago.group(1)) * _UNITS[ago.group(2)]))
        except OverflowError:
            raise ValueError(f"--since {text} reaches before the year 1") from None
    try:
        return since_of(datetime.fromisoformat(text))
    except ValueError:
        raise ValueError(f"--since takes 15m, 2h, 1d or an ISO time, not {text!r}") from None


def limit_value(text: str) -> Union[int, None]:
    """``N`` (a whole number, 0 or more), ``halt`` (0) or ``default`` (None: the declared limit)."""
    word = text.strip().lower()
    if word in ("halt", "default"):
        return 0 if word == "halt" else None
    if not word.isdigit():
        raise ValueError(f"a limit is a whole number, 'halt' or 'default', not {text!r}")
    return int(word)


def parser() -> argparse.ArgumentParser:
    for info in pkgutil.iter_modules(__path__):
        if info.name.startswith("cmd_"):
            importlib.import_module(f"{__name__}.{info.name}")
    top = argparse.ArgumentParser(
        prog="dramatiq-unique", description="See and steer the jobs, locks and slots of a dramatiq_unique app.",
        epilog="Each command takes the app module first (package.module[:broker]), as dramatiq does; without it, "
               "DRAMATIQ_UNIQUE_DATABASE_URL and DRAMATIQ_UNIQUE_REDIS_URL open the jobs read-only. " + EXIT_RULE,
    )
    commands = top.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for cmd in sorted(COMMANDS.values(), key=lambda c: c.name):
        sub = commands.add_parser(cmd.name, help=cmd.help, description=cmd.help)
        sub.add_argument("words", nargs="*", metavar=" ".join(("[APP]", *cmd.positionals)),
                         help="APP: the app module (package.module[:broker]); optional with the environment set")
        sub.add_argument("--app", help="the app module, instead of the first word")
        sub.add_argument("--path", default=".", help="directory added to sys.path before the import (default: .)")
        sub.add_argument("--json", action="store_true", help="print JSON")
        if cmd.arguments is not None:
            cmd.arguments(sub)
    return top


def main(argv: Optional[Sequence[str]] = None, *, context: Optional[Context] = None) -> int:
    """Run one command; returns its exit code (``context`` for tests: output streams, environment)."""
    ctx = context or Context()
    try:
        args = parser().parse_args(argv)
    except SystemExit as e:  # argparse: --help (0) or a usage error (2)
        return int(e.code or 0)
    cmd: Command = COMMANDS[args.command]
    try:
        app, args.words = (None, args.words) if args.app else split_words(
            cmd, args.words, lambda word: looks_like_app(word, args.path))
        ctx.app, ctx.path, ctx.json = args.app or app, args.path, args.json
        if cmd.load:
            ctx.load()
        if cmd.writes:
            ctx.refuse_read_only(cmd.name)
        return cmd.run(ctx, args)
    except (*REFUSED, Usage, ValueError, DramatiqUniqueError) as e:
        ctx.say(f"{cmd.name}: {_what(e)}")
        # 2 for Usage and ValueError (InvalidOption is one: a bad limit or key for the actor); 1 for the
        # refusals and the rest (DuplicateJob, IdempotencyKeyReused...): understood, not done.
        return 2 if isinstance(e, (Usage, ValueError)) and not isinstance(e, REFUSED) else 1


def _what(error: Exception) -> str:
    if isinstance(error, JobNotFound):
        return f"no job {error.detail} in this app"
    if isinstance(error, (Refused, Usage, InvalidOption, JobStateError)) and error.detail:
        return error.detail  # says it all: the class's own words would only come before it
    return str(error)


def entry_point() -> None:
    """The ``dramatiq-unique`` console script (and ``python -m dramatiq_unique``)."""
    try:
        code = main()
        sys.stdout.flush()
    except KeyboardInterrupt:
        code = 130
    except BrokenPipeError:  # | head: the reader left; say nothing more
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        code = 0
    sys.exit(code)
