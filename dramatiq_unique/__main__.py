"""Command line: ``python -m dramatiq_unique redrive APP_MODULE [--interval MS] [--once]``;
``check``, ``status`` and ``migrate`` (dramatiq_unique/health/commands.py).

APP_MODULE is imported like Dramatiq's own CLI does (``package.module``
or ``package.module:broker``); it must call :func:`dramatiq_unique.setup`
and declare its actors.  ``--once`` runs one pass, prints its counts as
JSON and exits; without it the re-drive runs every ``--interval`` ms
(the ``redrive_interval`` setting by default) until SIGINT or SIGTERM.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import signal
import sys
import threading
from typing import Optional, Sequence

import dramatiq

from dramatiq_unique import suite as _config
from dramatiq_unique.durable.redrive import redrive
from dramatiq_unique.durable.scheduler import start_redriver
from dramatiq_unique.errors import DramatiqUniqueError
from dramatiq_unique.health import commands as health


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m dramatiq_unique", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    cmd = commands.add_parser("redrive", help="run the re-drive (lost, due and retrying jobs; pruning)")
    cmd.add_argument("app", metavar="APP_MODULE", help="module that sets up the suite: package.module[:broker]")
    cmd.add_argument("--interval", type=int, default=None, metavar="MS", help="ms between passes")
    cmd.add_argument("--once", action="store_true", help="run one pass, print its counts, exit")
    cmd.add_argument("--path", default=".", help="directory added to sys.path before the import (default: .)")
    health.add_commands(commands)  # check, status, migrate
    return parser


def _load(app: str) -> Optional[dramatiq.Broker]:
    module_name, _, attribute = app.partition(":")
    module = importlib.import_module(module_name)
    if attribute:
        broker = getattr(module, attribute)
        if not isinstance(broker, dramatiq.Broker):
            raise SystemExit(f"{app} is not a Dramatiq broker")
        return broker
    return None


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.command != "redrive":
        return health.run(args)
    sys.path.insert(0, os.path.abspath(args.path))
    broker = _load(args.app)
    try:
        suite = _config.current()
    except DramatiqUniqueError:
        print(f"{args.app} did not call dramatiq_unique.setup()", file=sys.stderr)
        return 2
    broker = broker or suite.broker or dramatiq.get_broker()
    if args.once:
        try:
            counts = redrive(broker, suite=suite)
        except DramatiqUniqueError as e:
            print(f"re-drive pass failed: {e}", file=sys.stderr)
            return 1
        print(json.dumps(counts.as_dict()))
        return 0
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    scheduler = start_redriver(args.interval, suite=suite, broker=broker)
    interval = args.interval or suite.redrive_interval
    logging.getLogger(__name__).info("Re-drive running every %s ms; Ctrl-C stops it.", interval)
    try:
        while not stop.wait(1):
            pass
    finally:
        scheduler.shutdown(wait=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
