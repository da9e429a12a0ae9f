"""Lua scripts on the hot paths, called over a connection of the calling thread's own.

Every lock, slot and wake-up operation of a job is one ``EVALSHA``.
Through redis-py's client each costs about 80 us of Python time (the
pool's check-out with a readiness poll, retries, metrics hooks), against
about 30 us sent straight over a connection (measured on this project's
2-core machine with redis-py 8): for a unique job that is more than the
database write.  So each thread keeps one connection per client, made
from the client's own connection settings, and sends the script itself.

What redis-py's client would do for us and we do here instead: load the
script when the server does not know it (``NOSCRIPT``), and reconnect
once when the connection broke (a restarted Redis).  All our scripts
are safe to repeat: they take or free a named holder's token.
"""

from __future__ import annotations

import hashlib
import os
import threading
import weakref
from typing import Any, Sequence

import redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError
from redis.exceptions import TimeoutError as RedisTimeoutError

#: How many times a call is sent when the connection broke or the script was unknown.
ATTEMPTS = 3


class _Connections(threading.local):
    def __init__(self) -> None:
        # Keyed by the pool itself, not id(pool): a new pool may reuse a dead one's id.
        self.by_pool: weakref.WeakKeyDictionary[Any, tuple[int, Any]] = weakref.WeakKeyDictionary()


_local = _Connections()


def _connection(client: redis.Redis) -> Any:
    pool = client.connection_pool
    pid, conn = _local.by_pool.get(pool, (None, None))
    if conn is None or pid != os.getpid():  # a forked child must not share its parent's socket
        # Not checked out of the pool: it belongs to this thread for good
        # and is closed with the thread or the pool (its finaliser disconnects).
        conn = pool.connection_class(**pool.connection_kwargs)
        _local.by_pool[pool] = (os.getpid(), conn)
    return conn


class Script:
    """A Lua script of ours, called like redis-py's ``Script``: ``script(keys=..., args=...)``."""

    def __init__(self, client: redis.Redis, text: str) -> None:
        self.client = client
        self.text = text
        self.sha = hashlib.sha1(text.encode()).hexdigest()

    def __call__(self, keys: Sequence[Any] = (), args: Sequence[Any] = ()) -> Any:
        conn = _connection(self.client)
        for attempt in range(1, ATTEMPTS + 1):
            try:
                conn.send_command("EVALSHA", self.sha, len(keys), *keys, *args)
                return conn.read_response()
            except NoScriptError:
                # Redis restarted or flushed its scripts: load it, send again.
                conn.send_command("SCRIPT", "LOAD", self.text)
                conn.read_response()
            except (RedisConnectionError, RedisTimeoutError):
                conn.disconnect()
                if attempt == ATTEMPTS:
                    raise
        raise redis.RedisError(f"script {self.sha} could not be run")


def register(client: redis.Redis, text: str) -> Script:
    """The fast counterpart of ``client.register_script(text)``."""
    return Script(client, text)
