"""Many calls of one script in one round trip, as one MULTI/EXEC, over the calling thread's own
connection (:mod:`dramatiq_unique.redis.scripts`): the bulk actions free their locks so
(:mod:`dramatiq_unique.durable.bulk_actions`).

The commands are packed by redis-py (``pack_commands``), sent in one write, and their replies read
one by one, as redis-py's pipeline does, without the pipeline's own machinery around them.  The
MULTI/EXEC makes the batch all or nothing on the server: a connection lost before EXEC arrived runs
none of it.  As for one call, the batch is sent again only when a connection that had worked broke
under it (a restarted Redis), and once.
"""

from __future__ import annotations

from typing import Any, Sequence

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

from dramatiq_unique.redis.scripts import Script, link_of


def run_all(script: Script, calls: Sequence[tuple[Sequence[Any], Sequence[Any]]]) -> list:
    """Run ``script`` once per ``(keys, args)`` in ``calls``, in one MULTI/EXEC; returns its replies, one per call.
    Raises redis-py's errors: a connection error, or the first error reply (then none of it ran,
    unless a script itself failed part way)."""
    commands: list[tuple[Any, ...]] = [("MULTI",), ("SCRIPT", "LOAD", script.text)]  # a restarted server knows it again
    commands += [("EVALSHA", script.sha, len(keys), *keys, *args) for keys, args in calls]
    commands.append(("EXEC",))
    for attempt in (1, 2):
        link = link_of(script.client)
        fresh = not link.answered
        try:
            replies = link.call_all(commands)
        except RedisConnectionError:
            if fresh or attempt == 2:
                raise
            continue
        break
    for reply in replies[:-1]:
        if isinstance(reply, ResponseError):  # refused when queued: EXEC aborted it all
            raise reply
    result = replies[-1]
    if isinstance(result, ResponseError):
        raise result
    for reply in result or ():
        if isinstance(reply, ResponseError):
            raise reply
    return list(result or ())[1:]  # the SCRIPT LOAD's reply left out
