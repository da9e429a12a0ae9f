"""What the frameworks' tests share."""

from __future__ import annotations

import threading
from typing import Callable

from tests.durable import broker_messages


def published(broker) -> set[str]:
    """The message ids waiting in ``broker``'s default queue."""
    return {m["message_id"] for m in broker_messages(broker)}


def race(request: Callable[[str, Callable[[], None]], str]) -> dict[str, str]:
    """Two requests, ``request(name, sent)`` each, which send and then call ``sent()`` inside their transaction:
    the second starts once the first has sent, and the first commits 0.3 s later, so the second's send
    waits on the unique index meanwhile.  Returns each request's message id."""
    first_sent, results = threading.Event(), {}

    def first() -> None:
        results["a"] = request("a", lambda: (first_sent.set(), threading.Event().wait(0.3)))

    def second() -> None:
        assert first_sent.wait(10)
        results["b"] = request("b", lambda: None)

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    return results
