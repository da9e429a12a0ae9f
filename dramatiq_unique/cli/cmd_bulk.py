"""The bulk commands: retry-all (the dead set, or part of it) and cancel-all (waiting jobs).

Each counts what it would take, asks (``--yes`` skips the question), then acts in one UPDATE per
job table and store (:mod:`dramatiq_unique.durable.bulk_actions`).  Refused (exit 1) without the app,
as every change is, and when the question is not answered yes.
"""

from __future__ import annotations

import argparse

from dramatiq_unique.cli import values
from dramatiq_unique.cli.context import Context, Refused
from dramatiq_unique.cli.registry import command
from dramatiq_unique.durable.bulk_actions import CANCEL, RETRY, Outcome
from dramatiq_unique.ops import bulk


def _selection_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--actor", help="one actor's jobs")
    p.add_argument("--key", help="the unique key in words: user=7 (the parameters unique_args names)")
    p.add_argument("--yes", action="store_true", help="do it without asking")


def _retry_arguments(p: argparse.ArgumentParser) -> None:
    _selection_arguments(p)
    p.add_argument("--since", help="failed since: 15m, 2h, 1d, or an ISO time (UTC)")
    p.add_argument("--error", help="those whose error holds this text (any case): ConnectionError")


def _cancel_arguments(p: argparse.ArgumentParser) -> None:
    _selection_arguments(p)
    p.add_argument("--since", help="created since: 15m, 2h, 1d, or an ISO time (UTC)")
    p.add_argument("--status", help="pending, queued or retrying, or several comma-separated (default: all three)")


def _run(ctx: Context, args: argparse.Namespace, action: str) -> int:
    suite = ctx.load()
    sel = bulk.selection(suite, action, actor=args.actor, key=args.key, since=values.since(args.since),
                         error=getattr(args, "error", None), status=getattr(args, "status", None))
    what = bulk.described(action, sel, args.key)
    found = bulk.preview(suite, ctx.broker, action, sel)
    for down in found.down:
        ctx.say(f"not counted: {down}")
    if found.undeclared:
        ctx.say(f"{found.undeclared} {what} are of actors this app does not declare: left as they are")
    if not found.done:
        ctx.emit(found.as_dict(), lambda: f"no {what} to {action}")
        return 0
    if not args.yes and not ctx.confirm(f"{action.capitalize()} {found.done:,} {what}?"):
        raise Refused("not confirmed: nothing was done (--yes does it without asking)")
    done = bulk.act(suite, ctx.broker, action, sel)
    ctx.emit(done.as_dict(), lambda: _said(done, what))
    return 0


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
    lines += [f"not done in {down}" for down in done.down]
    return "\n".join(lines)


@command("retry-all", help="retry the dead set, or the dead jobs of an actor, key, error or time (asks first)",
         arguments=_retry_arguments, writes=True)
def retry_all(ctx: Context, args: argparse.Namespace) -> int:
    return _run(ctx, args, RETRY)


@command("cancel-all", help="cancel every waiting job of an actor, key, status or time, or all of them (asks first)",
         arguments=_cancel_arguments, writes=True)
def cancel_all(ctx: Context, args: argparse.Namespace) -> int:
    return _run(ctx, args, CANCEL)
