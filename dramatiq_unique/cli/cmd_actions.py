"""The commands that change state: retry, cancel, limit, prune, and the bulk retry-all and cancel-all
(which count, ask, then act).  Each is refused (exit 1) without the app, which declares the actors."""

from __future__ import annotations

import argparse
from typing import Any, Callable

from dramatiq_unique import ops
from dramatiq_unique.cli import command, limit_value, since
from dramatiq_unique.cli.context import Context, Refused, Usage
from dramatiq_unique.cli.output import pairs
from dramatiq_unique.durable.bulk_actions import CANCEL, RETRY, Outcome
from dramatiq_unique.durable.dead import cancel_job, retry_job
from dramatiq_unique.ops import actions


def _one(ctx: Context, args: argparse.Namespace, done: str, action: Callable[..., Any]) -> int:
    suite = ctx.load()
    view = ops.job(suite, action(args.words[0], suite=suite).message_id)
    ctx.emit(view.as_dict(), lambda: f"{done}: job {view.id} ({view.actor}) is {view.status}"
             + (f"; {view.why}" if view.why else ""))
    return 0


@command("retry", help="send a failed job again, as a new attempt of the same job", positionals=("ID",),
         writes=True)
def retry(ctx: Context, args: argparse.Namespace) -> int:
    return _one(ctx, args, "sent again", retry_job)


@command("cancel", help="cancel a waiting job: its message is skipped, its key freed", positionals=("ID",),
         writes=True)
def cancel(ctx: Context, args: argparse.Namespace) -> int:
    return _one(ctx, args, "cancelled", cancel_job)


@command("limit", help="set a slot limit at run time: N, halt (0) or default (removes it); KEY in words "
         "(customer=42), or a group's #hash as `slots` and `limits` show it", positionals=("ACTOR", "[KEY]",
         "N|halt|default"), writes=True)
def limit(ctx: Context, args: argparse.Namespace) -> int:
    words = args.words
    actor, key_text, value = words[0], (words[1] if len(words) == 3 else None), limit_value(words[-1])
    suite = ctx.load()
    config = suite.actor_config(actor)
    if config is None:
        raise Usage(f"no actor {actor!r} with concurrency slots is declared in the app")
    target = ops.limit_target(suite, config, key_text)
    status = ops.set_group_limit(suite, actor, target.group, value, words=target.words, key=target.key)
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
    return 0


@command("prune", help="delete the finished rows older than the retention now", writes=True)
def prune(ctx: Context, args: argparse.Namespace) -> int:
    suite = ctx.load()
    pruned = ops.prune(suite, ctx.broker or suite.broker)  # type: ignore[arg-type]
    ctx.emit({"pruned": pruned}, lambda: f"pruned {pruned} finished rows")
    return 0


def _bulk_arguments(action: str) -> Callable[[argparse.ArgumentParser], None]:
    def add(p: argparse.ArgumentParser) -> None:
        p.add_argument("--actor", help="one actor's jobs")
        p.add_argument("--key", help="the unique key in words: user=7 (the parameters unique_args names)")
        p.add_argument("--yes", action="store_true", help="do it without asking")
        p.add_argument("--since", help=f"{'failed' if action == RETRY else 'created'} since: 15m, 2h, 1d, or an "
                                       "ISO time (UTC)")
        if action == RETRY:
            p.add_argument("--error", help="those whose error holds this text (any case): ConnectionError")
        else:
            p.add_argument("--status", help="pending, queued or retrying, or several comma-separated (default: "
                                            "all three)")

    return add


def _bulk(ctx: Context, args: argparse.Namespace, action: str) -> int:
    suite = ctx.load()
    sel = actions.selection(suite, action, actor=args.actor, key=args.key, since=since(args.since),
                            error=getattr(args, "error", None), status=getattr(args, "status", None))
    what = actions.described(action, sel, args.key)
    found = actions.preview(suite, ctx.broker, action, sel)
    for down in found.down:
        ctx.say(f"not counted: {down}")
    if found.undeclared:
        ctx.say(f"{found.undeclared} {what} are of actors this app does not declare: left as they are")
    if not found.done:
        ctx.emit(found.as_dict(), lambda: f"no {what} to {action}")
        return 0
    if not args.yes and not ctx.confirm(f"{action.capitalize()} {found.done:,} {what}?"):
        raise Refused("not confirmed: nothing was done (--yes does it without asking)")
    done = actions.act(suite, ctx.broker, action, sel)
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
         arguments=_bulk_arguments(RETRY), writes=True)
def retry_all(ctx: Context, args: argparse.Namespace) -> int:
    return _bulk(ctx, args, RETRY)


@command("cancel-all", help="cancel every waiting job of an actor, key, status or time, or all of them (asks first)",
         arguments=_bulk_arguments(CANCEL), writes=True)
def cancel_all(ctx: Context, args: argparse.Namespace) -> int:
    return _bulk(ctx, args, CANCEL)
