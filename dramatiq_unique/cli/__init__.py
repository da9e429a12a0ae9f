"""The command line, ``dramatiq-unique COMMAND [APP] [WORDS] [--json]``: the commands
(:data:`~dramatiq_unique.cli.commands.COMMANDS`), their words, and one rule of exit codes for every
command: 0 done, 1 understood but not done, 2 not understood (``check``: 0 ok, 1 warning, 2 critical)."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Callable, Optional, Sequence

from dramatiq_unique.cli.commands import COMMANDS, Command, since
from dramatiq_unique.cli.context import DATABASE_ENV, REDIS_ENV, Context, Refused, Usage, looks_like_app
from dramatiq_unique.errors import DependencyUnavailable, DramatiqUniqueError, InvalidOption, JobNotFound, JobStateError

__all__ = ["COMMANDS", "Command", "Context", "Refused", "Usage", "main", "since"]

EPILOG = ("Each command takes the app module first (package.module[:broker]), as dramatiq does; without it, "
          "DRAMATIQ_UNIQUE_DATABASE_URL and DRAMATIQ_UNIQUE_REDIS_URL open the jobs read-only. Exit codes: 0 done; "
          "1 not done: not found, refused, or a store or Redis did not answer; 2 not understood: a bad command, "
          "option, word or value (check: 0 ok, 1 warning, 2 critical).")
#: Errors that mean "understood, but not done": exit 1.
REFUSED = (JobNotFound, JobStateError, Refused, DependencyUnavailable)


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


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="dramatiq-unique", epilog=EPILOG,
                                  description="See and steer the jobs, locks and slots of a dramatiq_unique app.")
    commands = top.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for cmd in sorted(COMMANDS.values(), key=lambda c: c.name):
        sub = commands.add_parser(cmd.name, help=cmd.help, description=cmd.help)
        sub.add_argument("words", nargs="*", metavar=" ".join(("[APP]", *cmd.positionals)),
                         help="APP: the app module (package.module[:broker]); optional with the environment set")
        sub.add_argument("--app", help="the app module, instead of the first word")
        sub.add_argument("--path", default=".", help="directory added to sys.path before the import (default: .)")
        sub.add_argument("--json", action="store_true", help="print JSON")
        for flag, keywords in cmd.options:
            sub.add_argument(flag, **keywords)
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
        if cmd.writes:  # loaded first: whether the suite is read-only is known once it is
            ctx.load()
        if cmd.writes and ctx.read_only:
            raise Refused(f"{cmd.name} changes state, and this suite comes from {DATABASE_ENV}/{REDIS_ENV} "
                          "(read-only): give the app module (APP or --app), which declares the actors")
        return cmd.run(ctx, args) or 0
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
