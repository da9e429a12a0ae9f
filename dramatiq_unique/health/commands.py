"""The ``check``, ``status`` and ``migrate`` commands of ``python -m dramatiq_unique``.

Each takes ``APP`` (``package.module``, ``package.module:broker`` or a callable, imported by
Dramatiq's own ``import_broker``), or, without it, the services named by the environment
(:mod:`dramatiq_unique.health.target`).  Exit codes: ``check`` 0 ok, 1 warning, 2 critical;
``status`` 0 current, 1 out of date (or a store down); ``migrate`` 0 done, 1 a store failed;
all 2 on a usage error.  ``--json`` prints JSON instead of a table.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
from typing import Any, Optional

import peewee as pw

from dramatiq_unique.health import checks, probe
from dramatiq_unique.health.target import DATABASE_ENV, Target, from_environment, of_suite, tables
from dramatiq_unique.storage import migrations, schema

USAGE = 2


def add_commands(commands: Any) -> None:
    """Add the three commands to an argparse sub-parsers object."""
    check = commands.add_parser("check", help="health: database and schema, Redis quorum, re-drive, stuck jobs")
    _common(check)
    check.add_argument("--probe-port", type=int, metavar="PORT", help="serve the check as an HTTP probe on PORT")
    check.add_argument("--probe-host", default="0.0.0.0", metavar="HOST", help="the probe's address (0.0.0.0)")
    check.add_argument("--overdue-after", type=int, default=checks.DEFAULT_OVERDUE_AFTER, metavar="MS",
                       help="ms a job may be overdue before it is reported")
    check.add_argument("--max-pass-age", type=int, default=None, metavar="MS",
                       help="ms the last re-drive pass may be old (default: 6 intervals, at least a minute)")
    check.set_defaults(run=check_command)
    status = commands.add_parser("status", help="schema version of every job table, per store")
    _common(status)
    status.set_defaults(run=status_command)
    migrate = commands.add_parser("migrate", help="bring every job table to this release's schema version")
    _common(migrate)
    migrate.add_argument("--dry-run", action="store_true", help="print what would be done, do nothing")
    migrate.set_defaults(run=migrate_command)


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("app", nargs="?", metavar="APP",
                        help=f"module that sets up the suite (default: the services in ${DATABASE_ENV})")
    parser.add_argument("--path", default=".", help="directory added to sys.path before the import (default: .)")
    parser.add_argument("--key-prefix", default=None, help="without APP: the app's key prefix")
    parser.add_argument("--json", action="store_true", help="print JSON")


def load(args: argparse.Namespace) -> Optional[Target]:
    """The target of a command: the app's suite, or the environment's services; None if neither."""
    if args.app:
        from dramatiq.cli import import_broker

        from dramatiq_unique import suite as _config

        sys.path.insert(0, os.path.abspath(args.path))
        with schema.tolerating_old():  # an app whose tables are out of date can still be looked at
            import_broker(args.app)
        return of_suite(_config.current())
    return from_environment(key_prefix=args.key_prefix)


def run(args: argparse.Namespace) -> int:
    """Run the command ``args`` names (``args.run``)."""
    try:
        target = load(args)
    except Exception as e:  # the app's import failed: say why, as a usage error
        print(f"could not load {args.app}: {type(e).__name__}: {e}", file=sys.stderr)
        return USAGE
    if target is None:
        print(f"give APP, or set {DATABASE_ENV}", file=sys.stderr)
        return USAGE
    try:
        return int(args.run(target, args))
    finally:
        target.close()


def _print(args: argparse.Namespace, data: Any, lines: list[str]) -> None:
    print(json.dumps(data, indent=2, default=str) if args.json else "\n".join(lines))


def check_command(target: Target, args: argparse.Namespace) -> int:
    def report() -> checks.Report:
        return checks.run(target, overdue_after=args.overdue_after, max_pass_age=args.max_pass_age)

    if args.probe_port is not None:
        server = probe.serve(report, args.probe_port, host=args.probe_host)
        print(f"health probe on http://{args.probe_host}:{server.server_address[1]}/", file=sys.stderr)
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass
        finally:
            server.server_close()
        return 0
    found = report()
    width = max(len(f.check) for f in found.findings)
    _print(args, found.as_dict(), [f"{checks.NAMES[f.severity].upper():8} {f.check:{width}}  {f.detail}"
                                   for f in found.findings] + [f"=> {checks.NAMES[found.code]}"])
    return found.code


def _each_table(target: Target, work: Any) -> list[migrations.TableStatus]:
    results = []
    for index, model in tables(target):
        store = target.store_name(index)
        try:
            results.append(work(model, store))
        except pw.DatabaseError as e:
            model._meta.database.close()
            results.append(migrations.TableStatus(schema.table_key(model), store, None, error=str(e).strip()))
    return results


def _rows(results: list[migrations.TableStatus], field: str) -> list[str]:
    lines = []
    for r in results:
        version = "-" if r.version is None else r.version
        state = f"ERROR {r.error}" if r.error else ("current" if r.current else "OUT OF DATE")
        lines.append(f"{r.table}  {r.store}  version {version} of {r.target}  {state}")
        lines += [f"    {item}" for item in getattr(r, field)]
    return lines


def status_command(target: Target, args: argparse.Namespace) -> int:
    results = _each_table(target, migrations.status)
    _print(args, [r.as_dict() for r in results], _rows(results, "pending"))
    return 0 if all(r.current for r in results) else 1


def migrate_command(target: Target, args: argparse.Namespace) -> int:
    if args.dry_run:
        results = _each_table(target, migrations.status)
        _print(args, [r.as_dict() for r in results], ["(dry run: nothing changed)", *_rows(results, "pending")])
        return 0 if all(r.error is None for r in results) else 1
    results = _each_table(target, migrations.migrate)
    _print(args, [r.as_dict() for r in results], _rows(results, "applied"))
    return 0 if all(r.error is None for r in results) else 1


def serve_in_thread(server: probe.ProbeServer) -> threading.Thread:
    """Serve a probe in a daemon thread (tests, and an app that embeds the probe)."""
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, name="dramatiq-unique-probe",
                              daemon=True)
    thread.start()
    return thread
