"""The commands that look: jobs, job, dead, locks, slots, stats."""

from __future__ import annotations

import argparse
import json
from typing import Any, Sequence

from dramatiq_unique import ops
from dramatiq_unique.cli import command, since
from dramatiq_unique.cli.context import Context
from dramatiq_unique.cli.output import detail, ms, pairs, table
from dramatiq_unique.ops.listing import DEFAULT_LIMIT
from dramatiq_unique.ops.views import SlotGroupView, View

ROW_HEADERS = ("ref", "status", "actor", "key", "attempts", "created", "finished")
DEAD_HEADERS = ("ref", "actor", "key", "attempts", "failed", "error")


def _listed(ctx: Context, found: Sequence[View], headers: Sequence[str], rows: list[tuple], empty: str) -> int:
    ctx.emit([f.as_dict() for f in found], lambda: table(headers, rows, empty=empty))
    return 0


def _jobs_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--status", help="one status or several, comma-separated (failed,retrying)")
    p.add_argument("--actor", help="one actor's jobs")
    p.add_argument("--key", help="the key in words: customer=42 (quote a value to make it a string)")
    p.add_argument("--since", help="created since: 15m, 2h, 1d, or an ISO time (UTC)")
    p.add_argument("--limit", type=int, default=DEFAULT_LIMIT, help="rows a page (default 50)")
    p.add_argument("--cursor", help="the next page: the cursor the page before printed")


@command("jobs", help="list jobs, newest first, a page at a time", arguments=_jobs_arguments)
def jobs(ctx: Context, args: argparse.Namespace) -> int:
    page = ops.jobs(ctx.load(), status=args.status, actor=args.actor, key=args.key, since=since(args.since),
                    limit=args.limit, cursor=args.cursor)

    def text() -> str:
        rows = [(r.ref, r.status, r.actor, r.key, r.attempts, r.created_at, r.finished_at) for r in page.rows]
        lines = [table(ROW_HEADERS, rows, empty="(no jobs)")]
        if page.cursor:
            lines.append(f"more: --cursor {page.cursor}")
        lines += [f"not read: {down}" for down in page.down]
        return "\n".join(lines)

    ctx.emit(page.as_dict(), text)
    return 0


def _json_text(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


@command("job", help="one job: status, attempts, fencing token, checkpoints, why it waits", positionals=("ID",))
def job(ctx: Context, args: argparse.Namespace) -> int:
    view = ops.job(ctx.load(), args.words[0])

    def text() -> str:
        items: list[tuple[str, Any]] = [
            ("id", view.id), ("message id", view.message_id), ("actor", view.actor), ("queue", view.queue),
            ("status", view.status),
        ]
        if view.why:
            items.append(("why", view.why))
        if view.slot:
            items.append(("slot", view.slot))
        items += [
            ("key", view.key or "-"), ("arguments", detail(_json_text(view.args) + " " + _json_text(view.kwargs))),
            ("attempts", view.attempts), ("fencing token", view.fencing_token), ("created", view.created_at),
            ("enqueued", view.enqueued_at), ("due", view.process_after), ("started", view.started_at),
            ("finished", view.finished_at), ("worker", view.worker), ("parked on", view.parked_on),
            ("table", view.table),
            ("checkpoints", ", ".join(view.checkpoints) if isinstance(view.checkpoints, dict) else "-"),
            ("result", detail(_json_text(view.result)) if view.result is not None else "-"),
        ]
        lines = [pairs(items)]
        if view.history:
            lines += ["", table(("attempt", "status", "started", "finished", "worker", "error"), [
                (a.attempt, a.status, a.started_at, a.finished_at, a.worker, a.error) for a in view.history])]
        if view.last_error:
            lines += ["", "last error:", view.last_error.rstrip()]
        return "\n".join(lines)

    ctx.emit(view.as_dict(), text)
    return 0


def _dead_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--actor", help="one actor's dead jobs")
    p.add_argument("--since", help="failed since: 15m, 2h, 1d, or an ISO time (UTC)")
    p.add_argument("--limit", type=int, default=100, help="rows at most (default 100)")


@command("dead", help="the dead set: failed jobs of tracked actors, the last to fail first",
         arguments=_dead_arguments)
def dead(ctx: Context, args: argparse.Namespace) -> int:
    rows = ops.dead(ctx.load(), actor=args.actor, since=since(args.since), limit=args.limit)
    lines = [(r.ref, r.actor, r.key, r.attempts, r.finished_at, r.error) for r in rows]
    return _listed(ctx, rows, DEAD_HEADERS, lines, "(the dead set is empty)")


@command("locks", help="held locks: holder job, time left, fencing token, waiters in order")
def locks(ctx: Context, args: argparse.Namespace) -> int:
    found = ops.locks(ctx.load())
    headers = ("kind", "actor", "key", "holder", "token", "left", "waiting", "waiters")
    rows = [(k.kind, k.actor, k.key, k.holder, k.token, ms(k.left_ms), k.waiting, k.waiters) for k in found]
    return _listed(ctx, found, headers, rows, "(no lock is held)")


def _limit_text(g: SlotGroupView) -> Any:
    if g.limit_from == "unknown":
        return "?"  # declared by the app: give APP to see it
    return "none" if g.limit is None else g.limit


@command("slots", help="slot groups: limit (and where it comes from), every holder, waiters, halted",
         arguments=lambda p: p.add_argument("--actor", help="one actor's groups"))
def slots(ctx: Context, args: argparse.Namespace) -> int:
    groups = ops.slots(ctx.load(), actor=args.actor)
    headers = ("actor", "key", "limit", "from", "held", "holders", "waiting", "waiters", "halted")
    # Every holder named (a list: a table cuts no list), a woken one still in the broker marked (queued).
    rows = [(g.actor, g.key, _limit_text(g), g.limit_from, g.held,
             [f"{i}(queued)" if i in g.queued_holders else str(i) for i in g.holders], g.waiting, g.waiters,
             "HALTED" if g.halted else "") for g in groups]

    def text() -> str:
        lines = [table(headers, rows, empty="(no slot group)")]
        lines += [f"{g.actor} {g.key}: {g.note}" for g in groups if g.note]
        if any(g.limit_from == "unknown" for g in groups):
            lines.append("?: declared by the app, which this command did not import (give APP to see it)")
        return "\n".join(lines)

    ctx.emit([g.as_dict() for g in groups], text)
    return 0


@command("limits", help="the limits set at run time, with their keys in words (`limit ... default` removes one)",
         arguments=lambda p: p.add_argument("--actor", help="one actor's limits"))
def limits(ctx: Context, args: argparse.Namespace) -> int:
    found = ops.limits(ctx.load(), actor=args.actor)
    rows = [(o.actor, o.key, o.limit, o.set_at) for o in found]
    return _listed(ctx, found, ("actor", "key", "limit", "set"), rows, "(no limit set at run time)")


@command("stats", help="counts by status and actor, throughput, p50/p95 of waiting and running times",
         arguments=lambda p: p.add_argument("--minutes", type=int, default=15, help="the window (default 15)"))
def stats(ctx: Context, args: argparse.Namespace) -> int:
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
        lines += [f"not read: {down}" for down in s.down]
        return "\n".join(lines)

    ctx.emit(s.as_dict(), text)
    return 0
