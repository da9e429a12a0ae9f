"""The commands that change state: retry, cancel, limit, prune.  Each is refused (exit 1) when
the suite comes from the environment: only the app declares the actors they act on."""

from __future__ import annotations

import argparse

from dramatiq_unique import ops
from dramatiq_unique.cli import values
from dramatiq_unique.cli.context import Context, Usage
from dramatiq_unique.cli.output import pairs
from dramatiq_unique.cli.registry import command
from dramatiq_unique.ops.views import JobView


def _changed(ctx: Context, what: str, view: JobView) -> None:
    ctx.emit(view.as_dict(), lambda: f"{what}: job {view.id} ({view.actor}) is {view.status}"
             + (f"; {view.why}" if view.why else ""))


@command("retry", help="send a failed job again, as a new attempt of the same job", positionals=("ID",),
         writes=True)
def retry(ctx: Context, args: argparse.Namespace) -> int:
    suite = ctx.load()
    row = ops.retry(suite, args.words[0])
    _changed(ctx, "sent again", ops.job(suite, row.message_id))
    return 0


@command("cancel", help="cancel a waiting job: its message is skipped, its key freed", positionals=("ID",),
         writes=True)
def cancel(ctx: Context, args: argparse.Namespace) -> int:
    suite = ctx.load()
    row = ops.cancel(suite, args.words[0])
    _changed(ctx, "cancelled", ops.job(suite, row.message_id))
    return 0


@command("limit", help="set a slot limit at run time: N, halt (0) or default (removes it); KEY in words "
         "(customer=42), or a group's #hash as `slots` and `limits` show it", positionals=("ACTOR", "[KEY]",
         "N|halt|default"), writes=True)
def limit(ctx: Context, args: argparse.Namespace) -> int:
    words = args.words
    actor, key_text, value = words[0], (words[1] if len(words) == 3 else None), values.limit(words[-1])
    suite = ctx.load()
    config = suite.actor_config(actor)
    if config is None:
        raise Usage(f"no actor {actor!r} with concurrency slots is declared in the app")
    target = ops.limit_target(suite, config, key_text)
    status = ops.set_group_limit(suite, actor, target.group, value, words=target.words, key=target.key)
    if target.warning and value is not None:
        ctx.say(f"limit: warning: {target.warning}")
    shown = target.words or (key_text if target.group else None)
    group = f"{actor} {shown}" if shown else actor
    data = {"actor": actor, "key": shown, "group": target.group, "limit": status.limit, "default": status.default,
            "override": status.override, "holders": status.holders, "parked": status.parked,
            "warning": target.warning if value is not None else ""}
    ctx.emit(data, lambda: pairs([
        ("group", group), ("limit", "none" if status.limit is None else status.limit),
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
