"""The commands that keep running: redrive and web."""

from __future__ import annotations

import argparse
import logging
import signal
import threading

from dramatiq_unique.cli import command
from dramatiq_unique.cli.context import Context, Usage
from dramatiq_unique.cli.output import LINES, visible
from dramatiq_unique.durable.redrive import redrive as redrive_pass
from dramatiq_unique.durable.redrive import start_redriver

logger = logging.getLogger(__name__)


def _redrive_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--interval", type=int, default=None, metavar="MS", help="ms between passes")
    p.add_argument("--once", action="store_true", help="run one pass, print its counts (--json: as JSON), exit")


@command("redrive", help="run the re-drive (lost, due and retrying jobs; pruning)", arguments=_redrive_arguments,
         writes=True)
def redrive(ctx: Context, args: argparse.Namespace) -> int:
    suite = ctx.load()
    broker = ctx.broker or suite.broker
    if args.once:
        counts = redrive_pass(broker, suite=suite).as_dict()
        if not counts.pop("ran"):
            ctx.emit({"ran": False, **counts}, lambda: "another process is running a pass: this one did nothing")
            return 0
        ctx.emit({"ran": True, **counts}, lambda: "one pass: " + ", ".join(f"{n} {what}" for what, n in counts.items()))
        return 0
    _log_visibly()
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    scheduler = start_redriver(args.interval, suite=suite, broker=broker)
    logger.info("Re-drive running every %s ms; Ctrl-C stops it.", args.interval or suite.redrive_interval)
    try:
        while not stop.wait(1):
            pass
    finally:
        scheduler.shutdown(wait=True)
    return 0


def _web_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8080, help="port (default 8080)")
    p.add_argument("--read-only", action="store_true", help="no actions (always so without the app)")
    p.add_argument("--allow-anonymous", action="store_true",
                   help="on an address other than loopback, serve the actions without basic auth")


@command("web", help="serve the dashboard (needs the web extra); basic auth: DRAMATIQ_UNIQUE_WEB_AUTH=user:password",
         arguments=_web_arguments, load=False)
def web(ctx: Context, args: argparse.Namespace) -> int:
    try:
        from dramatiq_unique.web import serve  # type: ignore[import-not-found,unused-ignore]  # the [web] extra
        from dramatiq_unique.web.serve import (  # type: ignore[import-not-found,unused-ignore]
            AUTH_ENV,
            basic_auth_from_env,
            exposed,
        )
    except ImportError as e:
        raise Usage(f"the dashboard is not installed ({e}): pip install dramatiq_unique[web]") from e
    suite = ctx.load()
    read_only = args.read_only or ctx.read_only
    # Said in this command line's own words (serve() names its Python arguments).
    if exposed(args.host, guarded=basic_auth_from_env() is not None, read_only=read_only,
               allow_anonymous=args.allow_anonymous):
        raise Usage(f"serving the dashboard on {args.host} lets anyone who reaches it retry, cancel and halt jobs: "
                    f"set {AUTH_ENV}=user:password (basic auth), or give --read-only, or --allow-anonymous")
    _log_visibly()
    serve(suite, host=args.host, port=args.port, read_only=read_only, allow_anonymous=args.allow_anonymous)
    return 0


def _log_visibly() -> None:
    """Log lines to the terminal, any control character of a job's data written out; unless the app
    configured logging itself (its handlers are left as they are)."""
    if logging.getLogger().handlers:
        return
    handler = logging.StreamHandler()
    handler.setFormatter(_VisibleFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=logging.INFO, handlers=[handler])


class _VisibleFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return visible(super().format(record), keep=LINES)
