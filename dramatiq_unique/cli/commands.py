"""Every command, as data: its name, its words and options, and the ops function it runs.  A listing
command is its ops function (given the command's options by name) and the columns of its table; the
rest say in a function how they print, in aligned columns of cut cells, times to the second."""

from __future__ import annotations

import argparse
import dataclasses
import functools
import logging
import re
import signal
import threading
from datetime import datetime, timedelta
from operator import attrgetter
from typing import Any, Callable, Iterable, Optional, Sequence

from dramatiq_unique import ops
from dramatiq_unique.cli.context import DATABASE_ENV, LINES, PREFIX_ENV, Context, Refused, Usage, load_app, visible
from dramatiq_unique.durable import bulk_actions
from dramatiq_unique.durable.bulk_actions import CANCEL, RETRY, Outcome
from dramatiq_unique.durable.dead import cancel_job, retry_job, since_of
from dramatiq_unique.durable.redrive import redrive as redrive_pass
from dramatiq_unique.durable.redrive import start_redriver
from dramatiq_unique.health import checks, commands
from dramatiq_unique.health.target import Target, from_environment, of_suite
from dramatiq_unique.ops import actions
from dramatiq_unique.ops.listing import DEFAULT_LIMIT
from dramatiq_unique.ops.views import Page, SlotGroupView
from dramatiq_unique.ops.words import MAX_DETAIL, as_json, duration, one_line
from dramatiq_unique.slots import limits
from dramatiq_unique.storage import migrations, schema

logger = logging.getLogger(__name__)

#: A command's work; it returns its exit code (None: 0).
Run = Callable[[Context, argparse.Namespace], Optional[int]]
#: An option: its flag and :meth:`argparse.ArgumentParser.add_argument`'s keywords.
Option = tuple[str, dict[str, Any]]
_AGO = re.compile(r"^(\d+)\s*(ms|s|m|h|d)$")
_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
#: Characters of a cell kept (a longer one is cut, with an ellipsis).
MAX_CELL = 48
ms = functools.partial(duration, none="-")


@dataclasses.dataclass(frozen=True)
class Command:
    name: str
    help: str
    run: Run
    options: tuple[Option, ...] = ()
    #: The command's own positional words, in order; "[NAME]" for an optional one.
    positionals: tuple[str, ...] = ()
    #: Changes state: refused without the app (a suite from the environment is read-only).
    writes: bool = False


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


def _option(flag: str, help: str, **more: Any) -> Option:
    return flag, {"help": help, **more}


ACTOR = _option("--actor", "only this actor's jobs, groups or limits")
SINCE = _option("--since", "created (the dead set: failed) since: 15m, 2h, 1d, or an ISO time (UTC)")
KEY = _option("--key", "the key in words: customer=42 (quote a value to make it a string)")
YES = _option("--yes", "do it without asking", action="store_true")
#: The options of a bulk action but its last (the retry's --error, the cancel's --status).
BULK_OPTIONS = (ACTOR, _option("--key", "the unique key in words: user=7 (the parameters unique_args names)"),
                YES, SINCE)


def _given(args: argparse.Namespace, options: Sequence[Option]) -> dict[str, Any]:
    """The options' values by name, as the ops functions take them (``since`` as a time)."""
    given = {flag[2:].replace("-", "_"): getattr(args, flag[2:].replace("-", "_")) for flag, _ in options}
    if "since" in given:
        given["since"] = since(given["since"])
    return given


def cell(value: Any) -> str:
    return visible(one_line(value, MAX_CELL, none="-"))


def detail(text: str) -> str:
    """A value shown whole on a view of one job, cut only past :data:`MAX_DETAIL` characters."""
    if len(text) <= MAX_DETAIL:
        return text
    return f"{text[:MAX_DETAIL]}… ({len(text) - MAX_DETAIL} characters more: --json prints them all)"


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]], *, empty: str = "(none)") -> str:
    """``rows`` under ``headers``, in columns two spaces apart; ``empty`` if there are no rows."""
    body = [[cell(v) for v in row] for row in rows]
    if not body:
        return empty
    widths = [max(len(h), *(len(r[i]) for r in body)) for i, h in enumerate(headers)]
    lines = ["  ".join(h.upper().ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in body]
    return "\n".join(lines)


def pairs(items: Iterable[tuple[str, Any]]) -> str:
    """``name: value`` lines, the names aligned (a value of several lines keeps its own)."""
    items = list(items)
    width = max((len(name) for name, _ in items), default=0)
    shown = [(name, visible(v, keep=LINES) if isinstance(v, str) else cell(v)) for name, v in items]
    return "\n".join(f"{name.ljust(width)}  {v}" for name, v in shown)


#: A column: its header and what it shows of a row.
Column = tuple[str, Callable[[Any], Any]]


def _columns(spec: str, **made: Callable[[Any], Any]) -> tuple[Column, ...]:
    """``"ref created=created_at"``: a header alone shows the attribute of its name; ``made`` the rest."""
    found = []
    for word in spec.split():
        header, _, attribute = word.partition("=")
        found.append((header, made.get(header) or attrgetter(attribute or header)))
    return tuple(found)


def listing(
    name: str, help: str, read: Callable[..., Any], columns: tuple[Column, ...], empty: str,
    options: tuple[Option, ...] = (), notes: Callable[[Any], list[str]] = lambda found: [],
) -> Command:
    """A command that prints what ``read(suite, **options)`` finds as a table (``--json``: as it is)."""
    def run(ctx: Context, args: argparse.Namespace) -> None:
        found = read(ctx.load(), **_given(args, options))
        rows = found.rows if isinstance(found, Page) else found

        def text() -> str:
            cells = [[show(row) for _, show in columns] for row in rows]
            return "\n".join([table([header for header, _ in columns], cells, empty=empty), *notes(found)])

        ctx.emit(found.as_dict() if isinstance(found, Page) else [row.as_dict() for row in rows], text)

    return Command(name, help, run, options)


def _page_notes(page: Page) -> list[str]:
    more = [f"more: --cursor {page.cursor}"] if page.cursor else []
    return more + [f"not read: {down}" for down in page.down]


def _slot_notes(groups: list[SlotGroupView]) -> list[str]:
    notes = [f"{g.actor} {g.key}: {g.note}" for g in groups if g.note]
    if any(g.limit_from == "unknown" for g in groups):
        notes.append("?: declared by the app, which this command did not import (give APP to see it)")
    return notes


def job(ctx: Context, args: argparse.Namespace) -> None:
    view = ops.job(ctx.load(), args.words[0])

    def text() -> str:
        lines = [pairs([
            ("id", view.id), ("message id", view.message_id), ("actor", view.actor), ("queue", view.queue),
            ("status", view.status), *[(name, said) for name, said in (("why", view.why), ("slot", view.slot)) if said],
            ("key", view.key or "-"), ("arguments", detail(as_json(view.args) + " " + as_json(view.kwargs))),
            ("attempts", view.attempts), ("fencing token", view.fencing_token), ("created", view.created_at),
            ("enqueued", view.enqueued_at), ("due", view.process_after), ("started", view.started_at),
            ("finished", view.finished_at), ("worker", view.worker), ("parked on", view.parked_on),
            ("table", view.table),
            ("checkpoints", ", ".join(view.checkpoints) if isinstance(view.checkpoints, dict) else "-"),
            ("result", detail(as_json(view.result)) if view.result is not None else "-"),
        ])]
        if view.history:
            lines += ["", table(("attempt", "status", "started", "finished", "worker", "error"), [
                (a.attempt, a.status, a.started_at, a.finished_at, a.worker, a.error) for a in view.history])]
        if view.last_error:
            lines += ["", "last error:", view.last_error.rstrip()]
        return "\n".join(lines)

    ctx.emit(view.as_dict(), text)


def stats(ctx: Context, args: argparse.Namespace) -> None:
    s = ops.stats(ctx.load(), minutes=args.minutes)

    def text() -> str:
        statuses = sorted({st for counts in s.by_actor.values() for st in counts})
        lines = [
            f"last {s.minutes} min (finished jobs; waiting and running ones: all)",
            table(("actor", *statuses), [(a, *(c.get(st, 0) for st in statuses))
                                         for a, c in sorted(s.by_actor.items())], empty="(no jobs)"),
            "",
            f"finished per minute: {' '.join(str(n) for n in s.throughput)}",
            f"waiting  p50 {ms(s.waiting_ms['p50'])}  p95 {ms(s.waiting_ms['p95'])}"
            "  (created or due to started, time parked included)",
            f"parked   p50 {ms(s.parked_ms['p50'])}  p95 {ms(s.parked_ms['p95'])}"
            f"  ({s.parked} of {s.timed} jobs waited parked for a lock or a slot)",
            f"running  p50 {ms(s.running_ms['p50'])}  p95 {ms(s.running_ms['p95'])}",
        ]
        return "\n".join(lines + [f"not read: {down}" for down in s.down])

    ctx.emit(s.as_dict(), text)


def one_job(done: str, action: Callable[..., Any]) -> Run:
    """Retry or cancel one job, then show it as ``job`` does, in a line."""
    def run(ctx: Context, args: argparse.Namespace) -> None:
        suite = ctx.load()
        view = ops.job(suite, action(args.words[0], suite=suite).message_id)
        ctx.emit(view.as_dict(), lambda: f"{done}: job {view.id} ({view.actor}) is {view.status}"
                 + (f"; {view.why}" if view.why else ""))

    return run


def limit(ctx: Context, args: argparse.Namespace) -> None:
    words = args.words
    actor, key_text, value = words[0], (words[1] if len(words) == 3 else None), actions.limit_value(words[-1])
    suite = ctx.load()
    target = ops.limit_target(suite, actor, key_text)
    limits.set_group_limit(actor, target.group, value, suite=suite, words=target.words, key=target.key)
    status = limits.group_status(actor, target.group, suite=suite)
    if target.warning and value is not None:
        ctx.say(f"limit: warning: {target.warning}")
    shown = target.words or (key_text if target.group else None)
    data = {"actor": actor, "key": shown, "group": target.group, "limit": status.limit, "default": status.default,
            "override": status.override, "holders": status.holders, "parked": status.parked,
            "warning": target.warning if value is not None else ""}
    ctx.emit(data, lambda: pairs([
        ("group", f"{actor} {shown}" if shown else actor), ("limit", "none" if status.limit is None else status.limit),
        ("override", "-" if status.override is None else status.override),
        ("declared", "none" if status.default is None else status.default),
        ("holders", status.holders), ("parked", status.parked),
    ]))


def prune(ctx: Context, args: argparse.Namespace) -> None:
    suite = ctx.load()
    pruned = ops.prune(suite, ctx.broker or suite.broker)  # type: ignore[arg-type]
    ctx.emit({"pruned": pruned}, lambda: f"pruned {pruned} finished rows")


def bulk(action: str) -> Run:
    """Count what ``action`` takes, ask, then do it."""
    def run(ctx: Context, args: argparse.Namespace) -> None:
        suite = ctx.load()
        sel = actions.selection(suite, action, actor=args.actor, key=args.key, since=since(args.since),
                                error=getattr(args, "error", None), status=getattr(args, "status", None))
        what = actions.described(action, sel, args.key)
        found = bulk_actions.preview(suite, ctx.broker or suite.broker, action, sel)
        for down in found.down:
            ctx.say(f"not counted: {down}")
        if found.undeclared:
            ctx.say(f"{found.undeclared} {what} are of actors this app does not declare: left as they are")
        if not found.done:
            ctx.emit(found.as_dict(), lambda: f"no {what} to {action}")
            return
        if not args.yes and not ctx.confirm(f"{action.capitalize()} {found.done:,} {what}?"):
            raise Refused("not confirmed: nothing was done (--yes does it without asking)")
        done = actions.BULK[action](suite, ctx.broker or suite.broker, sel)
        ctx.emit(done.as_dict(), lambda: _said(done, what))

    return run


def _said(done: Outcome, what: str) -> str:
    if done.action == RETRY:
        lines = [f"retried {done.done:,} {what}: due now, the re-drive sends them "
                 f"(its next pass, or `redrive --once`)"]
        if done.blocked:
            named = ", ".join(f"{job} (key held by job {holder})" if holder else f"{job} (a newer dead job of its key "
                              f"was retried, or it failed meanwhile)" for job, holder in done.blocked_by)
            lines.append(f"left failed: {done.blocked:,}, their key held by another job: {named}"
                         + (" and more" if done.blocked > len(done.blocked_by) else ""))
    else:
        lines = [f"cancelled {done.done:,} {what}"]
    return "\n".join(lines + [f"not done in {down}" for down in done.down])


def health(report: Callable[..., int], help: str, options: tuple[Option, ...] = (), say: bool = False) -> Command:
    """A health command: ``report(target, emit, **options)`` on the app with the schema check off (its tables
    may be out of date: checked and migrated), else the environment's services as they are; closed after."""
    def run(ctx: Context, args: argparse.Namespace) -> int:
        if ctx.app:
            with schema.tolerating_old():
                ctx.suite, ctx.broker = load_app(ctx.app, ctx.path)
            target: Optional[Target] = of_suite(ctx.suite)
        else:
            target = from_environment(key_prefix=ctx.env.get(PREFIX_ENV), environ=ctx.env)
        if target is None:
            raise Usage(f"give the app module (APP or --app), or set {DATABASE_ENV}")
        try:
            return report(target, ctx.emit, **_given(args, options), **({"say": ctx.say} if say else {}))
        finally:
            target.close()

    return Command(report.__name__, help, run, options)


def redrive(ctx: Context, args: argparse.Namespace) -> None:
    suite = ctx.load()
    broker = ctx.broker or suite.broker
    if args.once:
        counts = redrive_pass(broker, suite=suite).as_dict()
        ran = counts.pop("ran")
        ctx.emit({"ran": ran, **counts}, lambda: "one pass: " + ", ".join(f"{n} {what}" for what, n in counts.items())
                 if ran else "another process is running a pass: this one did nothing")
        return
    log_visibly()
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


def web(ctx: Context, args: argparse.Namespace) -> None:
    try:
        from dramatiq_unique.web import serve  # type: ignore[import-not-found,unused-ignore]  # the [web] extra
        from dramatiq_unique.web.app import AUTH_ENV, basic_auth_from_env, exposed  # type: ignore[import-not-found,unused-ignore]
    except ImportError as e:
        raise Usage(f"the dashboard is not installed ({e}): pip install dramatiq_unique[web]") from e
    suite = ctx.load()
    read_only = args.read_only or ctx.read_only
    # Said in this command line's own words (serve() names its Python arguments).
    if exposed(args.host, guarded=basic_auth_from_env() is not None, read_only=read_only,
               allow_anonymous=args.allow_anonymous):
        raise Usage(f"serving the dashboard on {args.host} lets anyone who reaches it retry, cancel and halt jobs: "
                    f"set {AUTH_ENV}=user:password (basic auth), or give --read-only, or --allow-anonymous")
    log_visibly()
    serve(suite, host=args.host, port=args.port, read_only=read_only, allow_anonymous=args.allow_anonymous)


def log_visibly() -> None:
    """Log lines to the terminal, any control character of a job's data written out; unless the app
    configured logging itself (basicConfig leaves a root logger with handlers as it is)."""
    handler = logging.StreamHandler()
    handler.setFormatter(_VisibleFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=logging.INFO, handlers=[handler])


class _VisibleFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return visible(super().format(record), keep=LINES)


COMMANDS: dict[str, Command] = {c.name: c for c in (
    listing("jobs", "list jobs, newest first, a page at a time", ops.jobs,
            _columns("ref status actor key attempts created=created_at finished=finished_at"), "(no jobs)", (
                _option("--status", "one status or several, comma-separated (failed,retrying)"), ACTOR, KEY, SINCE,
                _option("--limit", "rows a page (default 50)", type=int, default=DEFAULT_LIMIT),
                _option("--cursor", "the next page: the cursor the page before printed")), _page_notes),
    Command("job", "one job: status, attempts, fencing token, checkpoints, why it waits", job, positionals=("ID",)),
    listing("dead", "the dead set: failed jobs of tracked actors, the last to fail first", ops.dead,
            _columns("ref actor key attempts failed=finished_at error"), "(the dead set is empty)",
            (ACTOR, SINCE, _option("--limit", "rows at most (default 100)", type=int, default=100))),
    listing("locks", "held locks: holder job, time left, fencing token, waiters in order", ops.locks,
            _columns("kind actor key holder token left waiting waiters", left=lambda k: ms(k.left_ms)),
            "(no lock is held)"),
    # Every holder named (a list: a table cuts no list), a woken one still in the broker marked (queued); a
    # limit declared by an app not imported is "?".
    listing("slots", "slot groups: limit (and where it comes from), every holder, waiters, halted", ops.slots,
            _columns("actor key limit from=limit_from held holders waiting waiters halted",
                     limit=lambda g: "?" if g.limit_from == "unknown" else ("none" if g.limit is None else g.limit),
                     holders=lambda g: [f"{i}(queued)" if i in g.queued_holders else str(i) for i in g.holders],
                     halted=lambda g: "HALTED" if g.halted else ""), "(no slot group)", (ACTOR,), _slot_notes),
    listing("limits", "the limits set at run time, with their keys in words (`limit ... default` removes one)",
            ops.limits, _columns("actor key limit set=set_at"), "(no limit set at run time)", (ACTOR,)),
    Command("stats", "counts by status and actor, throughput, p50/p95 of waiting and running times", stats,
            (_option("--minutes", "the window (default 15)", type=int, default=15),)),
    Command("retry", "send a failed job again, as a new attempt of the same job", one_job("sent again", retry_job),
            positionals=("ID",), writes=True),
    Command("cancel", "cancel a waiting job: its message is skipped, its key freed", one_job("cancelled", cancel_job),
            positionals=("ID",), writes=True),
    Command("limit", "set a slot limit at run time: N, halt (0) or default (removes it); KEY in words "
            "(customer=42), or a group's #hash as `slots` and `limits` show it", limit,
            positionals=("ACTOR", "[KEY]", "N|halt|default"), writes=True),
    Command("prune", "delete the finished rows older than the retention now", prune, writes=True),
    Command("retry-all", "retry the dead set, or the dead jobs of an actor, key, error or time (asks first)",
            bulk(RETRY), (*BULK_OPTIONS, _option("--error", "those whose error holds this text (any case): "
                                                 "ConnectionError")), writes=True),
    Command("cancel-all", "cancel every waiting job of an actor, key, status or time, or all of them (asks first)",
            bulk(CANCEL), (*BULK_OPTIONS, _option("--status", "pending, queued or retrying, or several "
                                                  "comma-separated (default: all three)")), writes=True),
    health(commands.check, "health: databases and schema, Redis quorum, the last re-drive pass, stuck jobs (exit 0 "
           "ok, 1 warning, 2 critical)", (
                _option("--probe-port", "serve the check as an HTTP probe on PORT", type=int, metavar="PORT"),
                _option("--probe-host", "the probe's address (0.0.0.0)", default="0.0.0.0", metavar="HOST"),
                _option("--probe-details", "the probe answers the whole report (store hosts, database user and "
                        "name, job ids), not only a status and each check's severity: for a port only operators "
                        "reach", action="store_true"),
                _option("--overdue-after", "ms a job may be overdue before it is reported (5 minutes)", type=int,
                        default=checks.DEFAULT_OVERDUE_AFTER, metavar="MS"),
                _option("--max-pass-age", "ms the last re-drive pass may be old (6 intervals, at least a minute)",
                        type=int, default=None, metavar="MS")), say=True),
    health(commands.status, "the schema version of every job table, per store (exit 1 if out of date)"),
    health(commands.migrate, "bring every job table to this release's schema version (idempotent)", (
        _option("--dry-run", "print what would be done, do nothing", action="store_true"),
        _option("--contract", "also drop the whole indexes this release replaced by partial ones: run it once no "
                "process of an earlier release runs (their unique sends name them)", action="store_true"),
        _option("--lock-timeout", "PostgreSQL: ms a step may wait for the table's lock (5000), then the migration "
                "fails", type=int, default=migrations.DEFAULT_LOCK_TIMEOUT, metavar="MS"))),
    Command("redrive", "run the re-drive (lost, due and retrying jobs; pruning)", redrive, (
        _option("--interval", "ms between passes", type=int, default=None, metavar="MS"),
        _option("--once", "run one pass, print its counts (--json: as JSON), exit", action="store_true")),
        writes=True),
    Command("web", "serve the dashboard (needs the web extra); basic auth: DRAMATIQ_UNIQUE_WEB_AUTH=user:password",
            web, (
                _option("--host", "address to listen on (default 127.0.0.1)", default="127.0.0.1"),
                _option("--port", "port (default 8080)", type=int, default=8080),
                _option("--read-only", "no actions (always so without the app)", action="store_true"),
                _option("--allow-anonymous", "on an address other than loopback, serve the actions without basic "
                        "auth", action="store_true"))),
)}
