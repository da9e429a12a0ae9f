"""The suite inside a web framework: its job tables on the framework's database connection, its sends
held in the framework's transactions (``django``: ``transaction.atomic()``; ``sqlalchemy``: ``session.begin()``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dramatiq_unique.suite import Suite


class FrameworkDatabase:
    """A framework's database: every transaction of it holds the suite's sends until it commits, as
    ``transaction()`` does."""

    def attach_suite(self, suite: "Suite") -> None:
        from dramatiq_unique.durable import outbox
        from dramatiq_unique.unique.send import install_enqueue

        suite.framework_block = outbox.Block(suite)
        if suite.broker is not None:  # untracked sends reach the outbox through the suite's enqueue
            install_enqueue(suite.broker, suite)
