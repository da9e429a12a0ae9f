"""A duplicate send answered early, on one small query, before the broker builds the message:
duplicates come in bursts (docs/discussions/how-it-is-built.md, "Sending")."""

from __future__ import annotations

import contextvars
from typing import TYPE_CHECKING, Any, Optional

from dramatiq_unique import options as opt
from dramatiq_unique.context import MARKER
from dramatiq_unique.durable import outbox
from dramatiq_unique.guard import guarded
from dramatiq_unique.observe import events
from dramatiq_unique.storage import jobs
from dramatiq_unique.unique.keys import derive_key

if TYPE_CHECKING:
    from dramatiq import Message

    from dramatiq_unique.suite import ActorConfig, Suite


class _Recent:
    """The unique keys this process sent last, up to ``size``: a key new to the process is more likely free."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.keys: dict[str, None] = {}

    def seen(self, key: str) -> bool:
        """Whether ``key`` was sent lately; it counts as sent from now on."""
        if key in self.keys:
            return True
        if len(self.keys) >= self.size:
            try:  # the oldest (dicts keep insertion order); another thread may have taken it
                del self.keys[next(iter(self.keys))]
            except (KeyError, RuntimeError, StopIteration):
                pass
        self.keys[key] = None
        return False


# The key skip_early derived for the send under way, (message id, key): its insert needs it too.
_derived: contextvars.ContextVar[Optional[tuple]] = contextvars.ContextVar("dramatiq_unique_key", default=None)


def key_of(config: "ActorConfig", message: "Message") -> Optional[str]:
    """The message's unique key (None for a tracked actor without ``unique_args``)."""
    derived = _derived.get()
    if derived is not None and derived[0] == message.message_id:
        return derived[1]
    spec: Any = config.for_message(message.options).unique_args
    return derive_key(config.actor_name, config.fn, spec, message.args, message.kwargs)


#: How many recently sent unique keys a process remembers (see skip_early).
RECENT_KEYS = 10_000
_recent = _Recent(RECENT_KEYS)


def skip_early(suite: "Suite", message: "Message") -> Optional[str]:
    """A duplicate ``skip`` send answered on one small query, before the broker builds the message: the id
    of the job holding the key, or None to go on (the insert decides in the end)."""
    config = suite.actor_config(message.actor_name)
    if config is None or MARKER in message.options or outbox.active() is not None:
        return None
    opts = message.options
    resolved = config.for_message(opts)
    spec, lock = resolved.unique_args, resolved.unique_lock
    if spec is None or lock not in opt.QUEUE_LOCKS or resolved.unique_on_conflict != "skip":
        return None
    key = derive_key(config.actor_name, config.fn, spec, message.args, message.kwargs)
    _derived.set((message.message_id, key))
    if key is None or not _recent.seen(key):
        return None  # a key new to this process: most likely free, the insert will tell
    ms = window(config, opts, lock)
    with guarded(f"recording {message.actor_name} job {message.message_id}"):
        # As the insert would: at once while the primary is remembered down, and remembered if it is.
        holder = suite.stores.on_primary(config.model, lambda: f"a unique send of {config.actor_name}",
                                         lambda: jobs.holder(config.model, key, ms, config.app))
    if holder is None or holder.message_id == message.message_id:
        return None
    events.duplicate("skip", message, holder.message_id, key)  # what the lookup read: no other query
    return holder.message_id


def window(config: "ActorConfig", opts: dict, lock: str) -> Optional[float]:
    """How long (ms) a holder counts, from its send; None: as long as it holds the key."""
    resolved = config.for_message(opts)
    ms = resolved.unique_window
    return resolved.unique_ttl if lock == opt.UNTIL_EXPIRED and ms is None else ms
