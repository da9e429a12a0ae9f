"""Lua scripts on the hot paths, over the calling thread's own connection: sent again only after a working
connection broke, loaded on ``NOSCRIPT``, posted without waiting, or batched (how-it-is-built.md, "Storage")."""

from __future__ import annotations

import collections
import hashlib
import logging
import os
import threading
import weakref
from typing import Any, Sequence

import redis
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError
from redis.retry import Retry

logger = logging.getLogger(__name__)

#: How many times a call is sent at most: once more after an open connection broke, and once
#: more after the server did not know the script (``NOSCRIPT``).
ATTEMPTS = 3
#: Posted calls whose replies a link leaves unread before it waits for them.
MAX_UNREAD = 64

#: A command: its name and arguments, as redis-py's ``send_command`` takes them.
Command = tuple[Any, ...]


class _Link:
    """One thread's redis-py connection to one Redis, and the posted calls whose replies are to come."""

    def __init__(self, pool: Any) -> None:
        # The client's own settings; no retry inside redis-py: when to send again is ours to say.
        kwargs = dict(pool.connection_kwargs, retry=Retry(NoBackoff(), 0))
        self.conn = pool.connection_class(**kwargs)
        self.pid = os.getpid()
        #: Whether a reply came over the open connection: only then is a broken call sent again.
        self.answered = False
        #: Posted calls whose replies are still to be read, oldest first: (command, script text).
        self.unread: collections.deque[tuple[Command, str]] = collections.deque()
        #: Scripts this connection has seen the server run: only those are posted.
        self.known: set[str] = set()

    def _connect(self) -> None:
        # A Sentinel connection finds the master in connect(), which redis-py 8's send_command skips for
        # its own connect_check_health(): unconnected, it would reach the default localhost:6379.
        if self.conn._sock is None:
            self.conn.connect()

    def call_all(self, commands: Sequence[Command]) -> list:
        """Send ``commands`` in one write; their replies, each error reply as its exception."""
        redo = None
        try:
            self._connect()
            # Posted calls' replies come first; no health-check PING then: it would read one of theirs.
            self.conn.send_packed_command(self.conn.pack_commands(commands), check_health=not self.unread)
            if self.unread:
                redo = self._settle()
            replies = [self._reply() for _ in commands]
        except BaseException:
            # A broken connection, a timeout, an exception raised mid-call (TimeLimit): a reply may be unread.
            self.close()
            raise
        self.answered = True
        if redo:
            self._redo(redo)
        return replies

    def post(self, command: Command, text: str) -> None:
        """Send ``command`` (an EVALSHA of ``text``) without waiting for its reply."""
        redo: list[tuple[Command, str]] = []
        try:
            self._connect()
            if len(self.unread) >= MAX_UNREAD:
                redo = self._settle()
            self.conn.send_command(*command, check_health=not self.unread)
            self.unread.append((command, text))
        except BaseException:
            self.close()
            raise
        self._redo(redo)

    def _reply(self) -> Any:
        try:
            # Bytes, whatever the client's decode_responses: the callers parse them.
            return self.conn.read_response(True)  # disable_decoding
        except ResponseError as e:  # an error reply: the connection is still in step
            return e

    def _settle(self) -> list[tuple[Command, str]]:
        """Read the replies of posted calls; returns those the server did not run for want of their script."""
        redo: list[tuple[Command, str]] = []
        while self.unread:
            command, text = self.unread.popleft()
            reply = self._reply()
            if isinstance(reply, NoScriptError):
                redo.append((command, text))
            elif isinstance(reply, ResponseError):
                logger.warning("A Redis script posted without waiting failed: %s", reply)
        return redo

    def _redo(self, redo: list[tuple[Command, str]]) -> None:
        for command, text in redo:  # Redis restarted or flushed its scripts: load, run now
            self.call_all([("SCRIPT", "LOAD", text), command])

    def close(self) -> None:
        self.unread.clear()
        self.known.clear()  # the next server (a restarted Redis) may not know them
        self.answered = False
        self.conn.disconnect()


class _Links(threading.local):
    def __init__(self) -> None:
        # Keyed by the pool itself, not id(pool): a new pool may reuse a dead one's id.
        self.by_pool: weakref.WeakKeyDictionary[Any, _Link] = weakref.WeakKeyDictionary()


_local = _Links()


def link_of(client: redis.Redis) -> _Link:
    """This thread's link to ``client``'s server."""
    pool = client.connection_pool
    link = _local.by_pool.get(pool)
    if link is None or link.pid != os.getpid():  # a forked child must not share its parent's socket
        # Not checked out of the pool: it closes with the thread or the pool.
        link = _local.by_pool[pool] = _Link(pool)
    return link


class Script:
    """A Lua script of ours, called like redis-py's ``Script``: ``script(keys=..., args=...)``."""

    def __init__(self, client: redis.Redis, text: str) -> None:
        self.client = client
        self.text = text
        self.sha = hashlib.sha1(text.encode()).hexdigest()

    def __call__(self, keys: Sequence[Any] = (), args: Sequence[Any] = ()) -> Any:
        return run_all(self, [(keys, args)], multi=False)[0]

    def post(self, keys: Sequence[Any] = (), args: Sequence[Any] = ()) -> None:
        """Run the script without waiting for its reply (one unknown to this connection: waiting for it)."""
        link = link_of(self.client)
        if self.sha not in link.known:  # first use on this connection: wait, loading it if need be
            self(keys, args)
            return
        link.post(("EVALSHA", self.sha, len(keys), *keys, *args), self.text)


def run_all(script: Script, calls: Sequence[tuple[Sequence[Any], Sequence[Any]]],
            before: Sequence[Command] = (), *, multi: bool = True) -> list:
    """Run the commands ``before``, then ``script`` once per ``(keys, args)`` in ``calls``, in one MULTI/EXEC (or
    one write, ``multi=False``); the script's replies, or redis-py's error (the first error reply).  The script is
    loaded with it until known; all is sent again after a broken connection: it must be safe to repeat."""
    for attempt in range(1, ATTEMPTS + 1):
        link = link_of(script.client)
        load = [("SCRIPT", "LOAD", script.text)] if script.sha not in link.known else []
        commands = [*load, *before, *(("EVALSHA", script.sha, len(keys), *keys, *args) for keys, args in calls)]
        fresh = not link.answered
        try:
            replies = link.call_all([("MULTI",), *commands, ("EXEC",)] if multi else commands)
        except RedisConnectionError:
            # A fresh connection that failed: the server is down; after a broken one, sent again once.
            if fresh or attempt == ATTEMPTS:
                raise
            continue
        if multi:  # refused when queued (EXEC then aborted it all), else the replies of EXEC
            queued = [reply for reply in replies[1:-1] if isinstance(reply, ResponseError)]
            replies = queued or ([replies[-1]] if isinstance(replies[-1], ResponseError) else list(replies[-1]))
        errors = [reply for reply in replies if isinstance(reply, ResponseError)]
        if any(isinstance(error, NoScriptError) for error in errors) and attempt < ATTEMPTS:
            link.known.discard(script.sha)  # Redis restarted or flushed its scripts: loaded again
            continue
        link.known.add(script.sha)  # an error reply too: the server ran it
        if errors:
            raise errors[0]
        return replies[len(load) + len(before):]
    raise redis.RedisError(f"script {script.sha} could not be run")
