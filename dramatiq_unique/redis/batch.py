"""Many calls of one script in one round trip, as one MULTI/EXEC, over the calling thread's own
connection (:mod:`dramatiq_unique.redis.scripts`): :func:`dramatiq_unique.send_many` publishes a
batch so (:mod:`dramatiq_unique.broker.publish`).

redis-py's pipeline would do it too, at about 25 us of Python per call for its general-purpose
packer and parser (measured with 10,000 publishes); here the calls are packed by ours.  The
MULTI/EXEC makes the batch all or nothing on the server: a connection lost before EXEC arrived runs
none of it.  As for one call, the batch is sent again only when a connection that had worked broke
under it (a restarted Redis), and once.
"""

from __future__ import annotations

from typing import Any, Sequence

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

from dramatiq_unique.redis.scripts import Script, _link, pack


def run_all(script: Script, calls: Sequence[tuple[Sequence[Any], Sequence[Any]]]) -> list:
    """Run ``script`` once per ``(keys, args)`` in ``calls``, in one MULTI/EXEC; returns its replies.
    Raises redis-py's errors: a connection error, or the first error reply (then none of it ran,
    unless a script itself failed part way)."""
    body = [pack("MULTI"), pack("SCRIPT", "LOAD", script.text)]  # a restarted server knows it again
    body += [pack("EVALSHA", script.sha, len(keys), *keys, *args) for keys, args in calls]
    body.append(pack("EXEC"))
    payload = b"".join(body)
    for attempt in (1, 2):
        link = _link(script.client)
        if link.unread:  # replies of calls posted earlier come first: settled by a call of its own
            link.call(pack("PING"))
        fresh = link.sock is None
        try:
            link._connect()
            link.sock.sendall(payload)
            replies = [link._read() for _ in body]
        except OSError as e:
            try:
                link._failed(e)  # closes the link, raises redis-py's error
            except RedisConnectionError:
                if fresh or attempt == 2:
                    raise
                continue
        except BaseException:
            link.close()  # out of step with the server: start afresh
            raise
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
    return list(result or ())
