"""Our Lua script calls over each thread's own connection (dramatiq_unique.redis.scripts), on real
redis-servers: each test over plain TCP and over TLS (with client certificates)."""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any, Iterator, Union

import pytest
import redis
from redis.connection import _HiredisParser, _RESP2Parser, _RESP3Parser

from dramatiq_unique.redis import scripts
from tests.durable import RedisServer
from tests.servers import PrivateRedis

ECHO = "return {1, ARGV[1], redis.call('get', KEYS[1]), tonumber(ARGV[2])}"


@pytest.fixture(params=["tcp", "tls"])
def server(request, certs) -> Iterator[Union[RedisServer, PrivateRedis]]:
    """A redis-server of the test's own, so it can be flushed and restarted."""
    own = RedisServer() if request.param == "tcp" else PrivateRedis(tls=certs, client_certs=True)
    own.start()
    try:
        yield own
    finally:
        own.stop()


def test_replies_come_back_as_redis_py_would_give_them(server):
    """Given a script replying with an array of an int, a large string, nil and a number, Then all parse."""
    client = redis.Redis.from_url(server.url)
    echo = scripts.Script(client, ECHO)
    big = "x" * 200_000  # more than one socket read
    assert echo(keys=["missing"], args=[big, 7]) == [1, big.encode(), None, 7]
    assert echo(keys=["missing"], args=["é", 8]) == [1, "é".encode(), None, 8]


def test_script_errors_raise_and_leave_the_connection_usable(server):
    client = redis.Redis.from_url(server.url)
    boom = scripts.Script(client, "return redis.error_reply('boom')")
    with pytest.raises(redis.ResponseError, match="boom"):
        boom()
    assert scripts.Script(client, "return 5")() == 5


def test_a_flushed_script_cache_and_a_restarted_server_are_recovered(server):
    """Given a script called once, When Redis forgets its scripts, and then restarts on the same
    port, Then the next calls load the script again and reconnect by themselves."""
    client = redis.Redis.from_url(server.url)
    echo = scripts.Script(client, ECHO)
    assert echo(keys=["k"], args=["a", 1])[1] == b"a"
    client.script_flush()
    assert echo(keys=["k"], args=["b", 2])[1] == b"b"
    server.stop()
    server.start()
    assert echo(keys=["k"], args=["c", 3])[1] == b"c"


def test_a_stopped_server_raises_a_connection_error(server):
    client = redis.Redis.from_url(server.url, socket_connect_timeout=0.5)
    echo = scripts.Script(client, ECHO)
    echo(keys=["k"], args=["a", 1])
    server.stop()
    with pytest.raises(redis.ConnectionError):
        echo(keys=["k"], args=["b", 2])


def test_each_thread_and_each_forked_child_has_its_own_connection(server):
    """Given calls from two threads and a forked child, Then each speaks over its own socket
    (a shared one would interleave replies)."""
    client = redis.Redis.from_url(server.url)
    echo = scripts.Script(client, ECHO)
    echo(keys=["k"], args=["parent", 0])
    errors: list[BaseException] = []

    def hammer(name: str) -> None:
        try:
            for i in range(300):
                assert echo(keys=["k"], args=[f"{name}-{i}", i])[1:] == [f"{name}-{i}".encode(), None, i]
        except BaseException as e:  # reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=hammer, args=(f"t{n}",)) for n in range(2)]
    for t in threads:
        t.start()
    pid = os.fork()
    if pid == 0:  # the child: its calls must not use the parent's socket
        try:
            ok = all(echo(keys=["k"], args=[f"child-{i}", i])[1] == f"child-{i}".encode() for i in range(100))
        finally:
            os._exit(0 if ok else 1)
    for t in threads:
        t.join(timeout=30)
    _, status = os.waitpid(pid, 0)
    assert not errors and os.WEXITSTATUS(status) == 0
    assert echo(keys=["k"], args=["parent again", 1])[1] == b"parent again"  # the child left it intact


def test_an_exception_between_request_and_reply_does_not_leave_a_reply_behind(server, monkeypatch):
    """Given a call interrupted after its request was sent (as an exception raised into the
    thread would), When the next call runs, Then it gets its own reply, not the stale one."""
    client = redis.Redis.from_url(server.url)
    echo = scripts.Script(client, ECHO)
    echo(keys=["k"], args=["warm", 0])
    link = scripts.link_of(client)

    def interrupted(*args, **kwargs) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(link.conn, "read_response", interrupted)
    with pytest.raises(KeyboardInterrupt):
        echo(keys=["k"], args=["lost", 1])
    monkeypatch.undo()
    assert echo(keys=["k"], args=["mine", 2])[1] == b"mine"


INCR_BY = "return redis.call('incrby', KEYS[1], ARGV[1])"


def test_posted_calls_run_in_order_before_the_threads_next_call(server):
    """Given calls posted without waiting, When the thread calls again, Then the posted ones ran
    first and in order, and their replies are not taken for the new call's."""
    client = redis.Redis.from_url(server.url)
    incr = scripts.Script(client, INCR_BY)
    for step in (1, 10, 100):
        incr.post(keys=["n"], args=[step])
    assert incr(keys=["n"], args=[1000]) == 1111
    for _ in range(scripts.MAX_UNREAD * 3):  # more than a link leaves unread: it reads as it goes
        incr.post(keys=["n"], args=[1])
    assert incr(keys=["n"], args=[0]) == 1111 + scripts.MAX_UNREAD * 3


def test_posted_calls_work_on_a_socket_numbered_above_1023(server):
    """Given a process with over a thousand files open and a client with a socket timeout, When
    calls are posted, Then their replies are read (select() refused such descriptors)."""
    spare = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    try:
        client = redis.Redis.from_url(server.url, socket_timeout=5)
        incr = scripts.Script(client, INCR_BY)
        assert incr(keys=["n"], args=[1]) == 1
        for _ in range(3):
            incr.post(keys=["n"], args=[1])
        assert incr(keys=["n"], args=[0]) == 4
    finally:
        for fd in spare:
            os.close(fd)


def test_a_posted_call_the_server_did_not_know_runs_once_loaded(server):
    """Given a posted call of a script Redis forgot, When the thread next calls, Then the posted
    one is loaded and run before that call returns; a posted call that fails is logged."""
    client = redis.Redis.from_url(server.url)
    incr = scripts.Script(client, INCR_BY)
    assert incr(keys=["n"], args=[1]) == 1
    client.script_flush()
    incr.post(keys=["n"], args=[5])
    assert client.get("n") == b"1", "not run: Redis did not know the script"
    assert scripts.Script(client, "return 0")() == 0
    assert client.get("n") == b"6"
    boom = scripts.Script(client, "return redis.error_reply('boom')")
    with pytest.raises(redis.ResponseError):
        boom()  # the first call of a script on a connection waits for its reply
    boom.post()
    assert incr(keys=["n"], args=[1]) == 7, "the failed post's reply was not taken for this call's"


def test_a_script_is_posted_only_once_the_connection_has_seen_it_run(server):
    """Given a fresh server that never ran the script, When the thread posts a call and makes no
    other, Then the call ran all the same (a posted NOSCRIPT would wait for a next call)."""
    client = redis.Redis.from_url(server.url)
    client.script_flush()
    scripts.Script(client, INCR_BY).post(keys=["first"], args=[3])
    assert client.get("first") == b"3"


def test_a_posted_call_on_a_stopped_server_raises_a_connection_error(server):
    client = redis.Redis.from_url(server.url, socket_connect_timeout=0.5)
    incr = scripts.Script(client, INCR_BY)
    incr(keys=["n"], args=[1])
    server.stop()
    with pytest.raises(redis.ConnectionError):
        for _ in range(3):  # the first send may still reach the kernel's buffer
            incr.post(keys=["n"], args=[1])
            incr(keys=["n"], args=[0])
    server.start()
    assert incr(keys=["n"], args=[0]) == 0, "a new server: the link reconnects"


@pytest.mark.parametrize("protocol", [2, 3])
def test_replies_are_bytes_in_either_protocol_whatever_the_clients_decoding(server, protocol):
    """Given clients speaking RESP2 and RESP3, one decoding replies to str, Then script replies come
    back as bytes (what the callers parse) and a batch's too."""
    client = redis.Redis.from_url(server.url, protocol=protocol, decode_responses=True)
    echo = scripts.Script(client, ECHO)
    assert echo(keys=["missing"], args=["é", 8]) == [1, "é".encode(), None, 8]
    batch = scripts.run_all(echo, [(["a"], ["x", 1]), (["b"], ["y", 2])])
    assert batch == [[1, b"x", None, 1], [1, b"y", None, 2]]


@pytest.mark.parametrize("parser", [_HiredisParser, _RESP2Parser, _RESP3Parser], ids=lambda p: p.__name__)
@pytest.mark.parametrize("timeout", [None, 5], ids=["no-timeout", "timeout"])
def test_posted_replies_are_read_in_order_with_each_parser(server, parser, timeout):
    """Given each of redis-py's parsers, with and without a socket timeout, When many calls are
    posted, Then a link owes at most MAX_UNREAD replies, and the next call reads them, in order."""
    protocol = 3 if parser is _RESP3Parser else 2
    client = redis.Redis.from_url(server.url, socket_timeout=timeout, parser_class=parser, protocol=protocol)
    incr = scripts.Script(client, INCR_BY)
    assert incr(keys=["n"], args=[1]) == 1
    link = scripts.link_of(client)
    posts = scripts.MAX_UNREAD * 2 + 3
    for _ in range(posts):
        incr.post(keys=["n"], args=[1])
        assert 1 <= len(link.unread) <= scripts.MAX_UNREAD
    assert incr(keys=["n"], args=[0]) == 1 + posts
    assert not link.unread


def test_two_posts_in_a_row_without_a_socket_timeout(server):
    """Given a client without a socket timeout, When a thread posts twice without a call between,
    Then both run (over TLS, a recv with MSG_DONTWAIT raised ValueError and the post was lost)."""
    client = redis.Redis.from_url(server.url, socket_timeout=None)
    incr = scripts.Script(client, INCR_BY)
    assert incr(keys=["n"], args=[1]) == 1
    incr.post(keys=["n"], args=[10])
    incr.post(keys=["n"], args=[100])
    assert incr(keys=["n"], args=[0]) == 111


def test_a_health_check_never_takes_a_posted_reply(server):
    """Given a client with redis-py's health checks, When a check would be due while posted
    replies are unread, Then no PING is sent in between (it would read a posted reply as its own)."""
    client = redis.Redis.from_url(server.url, health_check_interval=1)
    incr = scripts.Script(client, INCR_BY)
    assert incr(keys=["n"], args=[1]) == 1
    incr.post(keys=["n"], args=[1])
    time.sleep(1.2)  # a check is due
    incr.post(keys=["n"], args=[1])
    time.sleep(1.2)
    assert incr(keys=["n"], args=[0]) == 3
    time.sleep(1.2)  # nothing posted: the check runs, and the call gets its own reply
    assert incr(keys=["n"], args=[1]) == 4


def test_a_call_that_timed_out_is_not_sent_again(server, monkeypatch):
    """Given a server that stalls (SIGSTOP) under an open connection, Then a call raises redis-py's
    TimeoutError after one send, and the next call, once the server resumed, gets its own reply."""
    client = redis.Redis.from_url(server.url, socket_timeout=0.5)
    echo = scripts.Script(client, ECHO)
    echo(keys=["k"], args=["warm", 0])
    conn = scripts.link_of(client).conn
    sends: list[Any] = []
    real = conn.send_packed_command
    monkeypatch.setattr(conn, "send_packed_command", lambda *a, **k: (sends.append(a), real(*a, **k))[1])
    os.kill(server.proc.pid, signal.SIGSTOP)
    try:
        with pytest.raises(redis.TimeoutError):
            echo(keys=["k"], args=["stalled", 1])
        assert len(sends) == 1
    finally:
        os.kill(server.proc.pid, signal.SIGCONT)
    assert echo(keys=["k"], args=["mine", 2])[1] == b"mine"
