"""The commands of health and schema: check, status, migrate.  They load what they look at themselves:
an app with the schema check off, so that an app whose tables are out of date can still be checked
and migrated; without it, the environment's services as they are (no table created or refused)."""

from __future__ import annotations

import argparse
import contextlib
from typing import Iterator, Optional

from dramatiq_unique.cli import command
from dramatiq_unique.cli.context import DATABASE_ENV, PREFIX_ENV, Context, Usage, load_app
from dramatiq_unique.health import checks, commands
from dramatiq_unique.health.target import Target, from_environment, of_suite
from dramatiq_unique.storage import migrations, schema


@contextlib.contextmanager
def target_of(ctx: Context) -> Iterator[Target]:
    """The app's target, or the environment's; closed after the command."""
    if ctx.app:
        with schema.tolerating_old():
            ctx.suite, ctx.broker = load_app(ctx.app, ctx.path)
        target: Optional[Target] = of_suite(ctx.suite)
    else:
        target = from_environment(key_prefix=ctx.env.get(PREFIX_ENV), environ=ctx.env)
    if target is None:
        raise Usage(f"give the app module (APP or --app), or set {DATABASE_ENV}")
    try:
        yield target
    finally:
        target.close()


def _check_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--probe-port", type=int, metavar="PORT", help="serve the check as an HTTP probe on PORT")
    p.add_argument("--probe-host", default="0.0.0.0", metavar="HOST", help="the probe's address (0.0.0.0)")
    p.add_argument("--probe-details", action="store_true",
                   help="the probe answers the whole report (store hosts, database user and name, job ids), not "
                        "only a status and each check's severity: for a port only operators reach")
    p.add_argument("--overdue-after", type=int, default=checks.DEFAULT_OVERDUE_AFTER, metavar="MS",
                   help="ms a job may be overdue before it is reported (5 minutes)")
    p.add_argument("--max-pass-age", type=int, default=None, metavar="MS",
                   help="ms the last re-drive pass may be old (6 intervals, at least a minute)")


@command("check", help="health: databases and schema, Redis quorum, the last re-drive pass, stuck jobs "
         "(exit 0 ok, 1 warning, 2 critical)", arguments=_check_arguments, load=False)
def check(ctx: Context, args: argparse.Namespace) -> int:
    with target_of(ctx) as target:
        return commands.check(target, ctx.emit, overdue_after=args.overdue_after, max_pass_age=args.max_pass_age,
                              probe_port=args.probe_port, probe_host=args.probe_host, say=ctx.say,
                              probe_details=args.probe_details)


@command("status", help="the schema version of every job table, per store (exit 1 if out of date)", load=False)
def status(ctx: Context, args: argparse.Namespace) -> int:
    with target_of(ctx) as target:
        return commands.status(target, ctx.emit)


def _migrate_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dry-run", action="store_true", help="print what would be done, do nothing")
    p.add_argument("--lock-timeout", type=int, default=migrations.DEFAULT_LOCK_TIMEOUT, metavar="MS",
                   help="PostgreSQL: ms a step may wait for the table's lock (5000), then the migration fails")


@command("migrate", help="bring every job table to this release's schema version (idempotent)", load=False,
         arguments=_migrate_arguments)
def migrate(ctx: Context, args: argparse.Namespace) -> int:
    with target_of(ctx) as target:
        return commands.migrate(target, ctx.emit, dry_run=args.dry_run, lock_timeout=args.lock_timeout)
