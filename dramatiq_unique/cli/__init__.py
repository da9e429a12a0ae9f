"""The command line: ``python -m dramatiq_unique`` and ``dramatiq-unique``.

``dramatiq-unique COMMAND [APP] [WORDS] [--json]``: APP is the app module, imported as
Dramatiq's CLI imports it (``package.module``, ``package.module:broker`` or
``package.module:setup_callable``); without it the suite is opened read-only from
``DRAMATIQ_UNIQUE_DATABASE_URL`` and ``DRAMATIQ_UNIQUE_REDIS_URL``.

Exit codes, one rule for every command (:data:`EXIT_RULE`):

* 0: done;
* 1: understood, but not done: no such job, a job in the wrong state or whose key another job
  holds, a change refused (read-only, not confirmed), a store or Redis that does not answer;
* 2: not understood, as argparse answers a bad option: a command, option, word or value that
  is not one (a time, a status, a limit, a key, an id), missing or extra words, an actor that
  the app does not declare with what the command acts on, no app and no environment, a
  database URL the suite does not support.  The same command line never succeeds.

``check`` alone answers as monitoring expects: 0 ok, 1 warning, 2 critical (and 2 for a
command line it does not understand).

The commands live in the ``cmd_*`` modules of this package, registered by name
(:mod:`dramatiq_unique.cli.registry` says how to add one).
"""

from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import sys
from typing import Optional, Sequence

from dramatiq_unique.cli.context import Context, Refused, Usage, looks_like_app
from dramatiq_unique.cli.registry import COMMANDS, Command, command, split_words
from dramatiq_unique.errors import (
    DependencyUnavailable,
    DramatiqUniqueError,
    InvalidOption,
    JobNotFound,
    JobStateError,
)

__all__ = ["COMMANDS", "Context", "Refused", "Usage", "command", "main"]

#: The exit codes, in words (the module's docstring says which error gives which).
EXIT_RULE = ("Exit codes: 0 done; 1 not done: not found, refused, or a store or Redis did not answer; "
             "2 not understood: a bad command, option, word or value (check: 0 ok, 1 warning, 2 critical).")
#: Errors that mean "understood, but not done": exit 1.
REFUSED = (JobNotFound, JobStateError, Refused, DependencyUnavailable)


def _load_commands() -> None:
    for info in pkgutil.iter_modules(__path__):
        if info.name.startswith("cmd_"):
            importlib.import_module(f"{__name__}.{info.name}")


def parser() -> argparse.ArgumentParser:
    _load_commands()
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
    except REFUSED as e:
        ctx.say(f"{cmd.name}: {_what(e)}")
        return 1
    except (Usage, ValueError) as e:  # InvalidOption is a ValueError: a bad limit or key for the actor
        ctx.say(f"{cmd.name}: {_what(e)}")
        return 2
    except DramatiqUniqueError as e:  # DuplicateJob, IdempotencyKeyReused...: understood, not done
        ctx.say(f"{cmd.name}: {_what(e)}")
        return 1


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
