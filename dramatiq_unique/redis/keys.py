"""Every Redis key format the suite writes, under one prefix (the broker's own: broker/refs.py)."""

from __future__ import annotations

#: Default prefix of every Redis key the suite writes.
DEFAULT_KEY_PREFIX = "dramatiq_unique"
#: The prefix of every lock's own key (``redlock:<lock name>``): pottery's, so that a pottery
#: Redlock and the suite's exclude each other on the same name.
LOCK_PREFIX = "redlock"


class RedisKeys:
    """Formats of the suite's Redis keys under one prefix."""

    def __init__(self, prefix: str = DEFAULT_KEY_PREFIX) -> None:
        self.prefix = prefix

    def queue_lock(self, unique_key: str) -> str:
        """The lock a waiting job holds from enqueue (until it starts or finishes)."""
        return f"{self.prefix}:queue:{unique_key}"

    def execution_lock(self, unique_key: str) -> str:
        """The lock a running job holds while it executes."""
        return f"{self.prefix}:run:{unique_key}"

    def slots(self, group: str) -> str:
        """A slot group's holders: a sorted set of tokens scored by lease end (slots/gate.py)."""
        return f"{self.prefix}:slots:{group}"

    def limit(self, group: str) -> str:
        """A slot group's run-time limit (``set_concurrency_limit(..., key=...)``)."""
        return f"{self.prefix}:limit:{group}"

    def slot_jobs(self, group: str) -> str:
        """A slot group's notes: which job (message id) each token handed to a job waiting in the broker is for."""
        return f"{self.prefix}:slot-jobs:{group}"

    def message_limit(self, group: str) -> str:
        """A slot group's limit as the last message that brought its own ``concurrency_limit`` gave it."""
        return f"{self.prefix}:message-limit:{group}"

    def actor_limit(self, actor_name: str) -> str:
        """The run-time limit of all an actor's slot groups (``set_concurrency_limit(..., key=None)``)."""
        return f"{self.prefix}:actor-limit:{actor_name}"

    def limits_loaded(self) -> str:
        """Set while Redis holds every run-time limit of the app's database (slots/overrides.py)."""
        return f"{self.prefix}:limits-loaded"

    def wakeups(self) -> str:
        return f"{self.prefix}:wakeups"

    def redrive_lock(self) -> str:
        return f"{self.prefix}:redrive"

    def last_pass(self) -> str:
        """When the app's last re-drive pass ended, in ms since the epoch (read by the ``check`` command)."""
        return f"{self.prefix}:redrive:last-pass"


def glob_escape(text: str) -> str:
    """``text`` matched literally in a ``SCAN ... MATCH`` pattern."""
    return "".join(f"\\{c}" if c in "*?[]\\" else c for c in text)
