"""Lua scripts on the hot paths, called over a connection of the calling thread's own.

Every lock, slot and wake-up operation of a job is one ``EVALSHA``.
Through redis-py's client each costs about 80 us of Python time (the
pool's check-out with a readiness poll, retries, metrics hooks, its
general-purpose packer and parser), against about 20 us sent straight
over a socket (measured on this project's 2-core machine with redis-py
8): for a unique job that was more than its database write.  So each
thread keeps one connection per client: redis-py opens it, with the
client's own settings (address, TLS, password, database), and the
requests and replies then go over its socket, in RESP2.  Our scripts
reply with integers, strings, nil and flat arrays, which is all the
reader below parses.

What redis-py's client would do for us and we do here instead: load the
script when the server does not know it (``NOSCRIPT``), and reconnect
when the connection broke (a restarted Redis).  A call is sent again only
when a connection that had worked broke under it: the first send may have
run with its reply lost, so every script of ours is safe to repeat (it
recognises its caller's token: a repeated acquire finds the lock already
its own, a repeated slot enter its slot already held).  A connection that
could not be opened, or a call that timed out, is not sent again: the
server is down or stalled, and another send would only wait as long
again (against a Redlock master that is down, that wait is the whole
cost of the outage; see :mod:`dramatiq_unique.locks.redlock`).

A call may also be *posted* (:meth:`Script.post`): sent without waiting
for its reply, which is read before the link's next call, or by a later
post if it is already there.  A thread that waits for a reply gives up
the GIL, and under load gets it back only after another thread's turn:
measured here, 150 to 250 us of CPU per wait, against 30 to 50 us in an
idle process.  A unique job's queue lock is freed at its start this way
(the thread's own later calls come after it on the same connection, so a
send from inside the job finds it free).
"""

from __future__ import annotations

import collections
import hashlib
import logging
import os
import select
import socket
import threading
import weakref
from typing import Any, Sequence

import redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

logger = logging.getLogger(__name__)

#: How many times a call is sent at most: once more after an open connection broke, and once
#: more after the server did not know the script (``NOSCRIPT``).
ATTEMPTS = 3
#: Posted calls whose replies a link leaves unread before it waits for them.
MAX_UNREAD = 64
_CRLF = b"\r\n"


def pack(*args: Any) -> bytes:
    """A command in the Redis protocol."""
    out = [b"*%d\r\n" % len(args)]
    for arg in args:
        data = arg if isinstance(arg, bytes) else str(arg).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(out)


def _readable(sock: socket.socket) -> bool:
    """Whether ``sock`` has data now.  poll(), not select(): select() refuses a descriptor
    above 1023, which a busy process (or a long test run) reaches."""
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    return bool(poller.poll(0))


class _Link:
    """One thread's connection to one Redis: opened by redis-py, then spoken to directly."""

    def __init__(self, pool: Any) -> None:
        kwargs = dict(pool.connection_kwargs, protocol=2)  # the reader below speaks RESP2
        # Server push messages (redis-py 7+'s maintenance notifications) need RESP3: not on this link.
        kwargs.pop("maint_notifications_config", None)
        kwargs.pop("maint_notifications_pool_handler", None)
        self.conn = pool.connection_class(**kwargs)
        self.pid = os.getpid()
        self.sock: Any = None
        self.buf, self.pos = b"", 0
        #: Posted calls whose replies are still to be read, oldest first: (command, script text).
        self.unread: collections.deque[tuple[bytes, str]] = collections.deque()
        #: Scripts this connection has seen the server run: only those are posted (a posted
        #: call the server does not know is run again only at the link's next call, which a
        #: thread that goes idle may never make).
        self.known: set[str] = set()

    def call(self, command: bytes) -> Any:
        redo: list[tuple[bytes, str]] = []
        try:
            self._connect()
            self.sock.sendall(command)
            if self.unread:  # their replies come first
                redo = self._settle(block=True)
            reply = self._read()
        except OSError as e:  # socket.timeout included
            self._failed(e)
        except BaseException:
            # Anything else mid-call (an unparsable reply, or an exception raised into the
            # thread, as Dramatiq's TimeLimit does) may leave a reply unread: a later call
            # would take it for its own.  Start afresh, as redis-py does.
            self.close()
            raise
        self._redo(redo)
        return reply

    def post(self, command: bytes, text: str) -> None:
        """Send ``command`` (an EVALSHA of ``text``) without waiting for its reply."""
        redo: list[tuple[bytes, str]] = []
        try:
            self._connect()
            if self.unread:
                redo = self._settle(block=len(self.unread) >= MAX_UNREAD)
            self.sock.sendall(command)
            self.unread.append((command, text))
        except OSError as e:
            self._failed(e)
        except BaseException:
            self.close()
            raise
        self._redo(redo)

    def _connect(self) -> None:
        if self.sock is None:
            self.conn.connect()
            self.sock = self.conn._sock  # redis-py keeps the socket private

    def _failed(self, e: OSError) -> None:
        self.close()
        kind = RedisTimeoutError if isinstance(e, TimeoutError) else RedisConnectionError
        raise kind(f"Redis call failed: {e}") from e

    def _settle(self, block: bool) -> list[tuple[bytes, str]]:
        """Read the replies of posted calls (without ``block``: those already here); returns
        the calls the server did not run for want of their script."""
        redo: list[tuple[bytes, str]] = []
        if not block:
            try:
                if self.sock.gettimeout() is None:
                    data = self.sock.recv(65536, socket.MSG_DONTWAIT)
                elif _readable(self.sock):  # a timeout would make recv wait
                    data = self.sock.recv(65536)
                else:
                    return redo
            except BlockingIOError:
                return redo
            if not data:
                raise RedisConnectionError("Redis closed the connection")
            self.buf, self.pos = self.buf[self.pos :] + data, 0
        while self.unread and (block or self._complete()):
            command, text = self.unread.popleft()
            value = self._read()
            if isinstance(value, NoScriptError):
                redo.append((command, text))
            elif isinstance(value, ResponseError):
                logger.warning("A Redis script posted without waiting failed: %s", value)
        return redo

    def _complete(self) -> bool:
        """Whether the buffer holds a whole reply of one line or one string (no array)."""
        end = self.buf.find(_CRLF, self.pos)
        if end < 0 or self.buf[self.pos : self.pos + 1] == b"*":
            return False
        if self.buf[self.pos : self.pos + 1] == b"$":
            size = int(self.buf[self.pos + 1 : end])
            return size < 0 or len(self.buf) >= end + 2 + size + 2
        return True

    def _redo(self, redo: list[tuple[bytes, str]]) -> None:
        for command, text in redo:  # Redis restarted or flushed its scripts: load, run now
            self.call(pack("SCRIPT", "LOAD", text))
            self.call(command)

    def close(self) -> None:
        self.unread.clear()
        self.known.clear()  # the next server (a restarted Redis) may not know them
        self.sock, self.buf, self.pos = None, b"", 0
        self.conn.disconnect()

    def _fill(self) -> None:
        data = self.sock.recv(65536)
        if not data:
            raise RedisConnectionError("Redis closed the connection")
        self.buf, self.pos = self.buf[self.pos :] + data, 0

    def _line(self) -> bytes:
        while True:
            end = self.buf.find(_CRLF, self.pos)
            if end >= 0:
                line, self.pos = self.buf[self.pos : end], end + 2
                return line
            self._fill()

    def _read(self) -> Any:
        line = self._line()
        kind, rest = line[:1], line[1:]
        if kind == b":":
            return int(rest)
        if kind == b"$":
            size = int(rest)
            if size < 0:
                return None
            while len(self.buf) - self.pos < size + 2:
                self._fill()
            data, self.pos = self.buf[self.pos : self.pos + size], self.pos + size + 2
            return data
        if kind == b"*":
            size = int(rest)
            return None if size < 0 else [self._read() for _ in range(size)]
        if kind == b"+":
            return rest
        if kind == b"-":
            message = rest.decode(errors="replace")
            return (NoScriptError if message.startswith("NOSCRIPT") else ResponseError)(message)
        self.close()  # out of step with the server: start afresh
        raise RedisConnectionError(f"unexpected reply from Redis: {line[:50]!r}")


class _Links(threading.local):
    def __init__(self) -> None:
        # Keyed by the pool itself, not id(pool): a new pool may reuse a dead one's id.
        self.by_pool: weakref.WeakKeyDictionary[Any, _Link] = weakref.WeakKeyDictionary()


_local = _Links()


def _link(client: redis.Redis) -> _Link:
    pool = client.connection_pool
    link = _local.by_pool.get(pool)
    if link is None or link.pid != os.getpid():  # a forked child must not share its parent's socket
        # Not checked out of the pool: it belongs to this thread and closes with
        # the thread or the pool (the connection's finaliser disconnects).
        link = _local.by_pool[pool] = _Link(pool)
    return link


class Script:
    """A Lua script of ours, called like redis-py's ``Script``: ``script(keys=..., args=...)``."""

    def __init__(self, client: redis.Redis, text: str) -> None:
        self.client = client
        self.text = text
        self.sha = hashlib.sha1(text.encode()).hexdigest()

    def __call__(self, keys: Sequence[Any] = (), args: Sequence[Any] = ()) -> Any:
        link = _link(self.client)
        command = pack("EVALSHA", self.sha, len(keys), *keys, *args)
        resent = False
        for attempt in range(1, ATTEMPTS + 1):
            fresh = link.sock is None
            try:
                reply = link.call(command)
            except RedisConnectionError:
                # Sent again only over a connection that had worked (a restarted Redis, a
                # connection killed while idle), and once: a fresh one that failed means the
                # server is down.  The first send may have run: our scripts are safe to repeat.
                if fresh or resent or attempt == ATTEMPTS:
                    raise
                resent = True
                continue
            if isinstance(reply, NoScriptError):
                # Redis restarted or flushed its scripts: load it, send again.
                loaded = link.call(pack("SCRIPT", "LOAD", self.text))
                if isinstance(loaded, ResponseError):
                    raise loaded
                continue
            link.known.add(self.sha)  # an error reply too: the server ran it
            if isinstance(reply, ResponseError):
                raise reply
            return reply
        raise redis.RedisError(f"script {self.sha} could not be run")

    def post(self, keys: Sequence[Any] = (), args: Sequence[Any] = ()) -> None:
        """Run the script without waiting for its reply (see the module's docs); a script
        unknown to the server is loaded and run before the link's next call returns."""
        link = _link(self.client)
        if self.sha not in link.known:  # first use on this connection: wait, loading it if need be
            self(keys, args)
            return
        link.post(pack("EVALSHA", self.sha, len(keys), *keys, *args), self.text)


def register(client: redis.Redis, text: str) -> Script:
    """The fast counterpart of ``client.register_script(text)``."""
    return Script(client, text)
