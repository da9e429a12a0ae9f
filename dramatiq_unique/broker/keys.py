"""The Redis broker's own key layout, as Dramatiq 2.x's ``dispatch.lua`` writes it."""

from __future__ import annotations


class BrokerKeys:
    """Formats of Dramatiq's Redis broker keys under its namespace, as its ``dispatch.lua``
    writes them: the suite reads them (presence.py) and writes them for tracked messages
    (publish.py, acks.py, delivery.py)."""

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace

    def queue(self, queue_name: str) -> str:
        """A queue's list of message ids."""
        return f"{self.namespace}:{queue_name}"

    def messages(self, queue_name: str) -> str:
        """A queue's hash of message id to message body."""
        return f"{self.namespace}:{queue_name}.msgs"

    def acks(self, worker_id: str, queue_name: str) -> str:
        """The ids a worker fetched from a queue and has not acked yet."""
        return f"{self.namespace}:__acks__.{worker_id}.{queue_name}"

    def heartbeats(self) -> str:
        """The broker processes, scored by their last call's time."""
        return f"{self.namespace}:__heartbeats__"
