"""Every Redis script of ours is safe to send again after a lost reply.

``scripts.Script`` sends a call again when an open connection broke under it:
the first send may have run, its reply lost.  Each script must then
recognise its caller's token and answer as the first send would have.

Two kinds of test: each script called twice with the same token (on the
shared Redis under the test's own key prefix), and the lost reply itself:
made by a link that reads the server's reply and then breaks as a reset
connection would (the server ran the call; the caller never heard), and
over the network, by a proxy that drops a reply and closes the connection.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import pytest
import redis

import dramatiq_unique
from dramatiq_unique.locks.redlock import KEPT, NOT_HELD, RELEASED, Locks, new_token
from dramatiq_unique.redis import scripts
from dramatiq_unique.redis.keys import LOCK_PREFIX
from dramatiq_unique.slots.gate import gate_of
from tests.conftest import REDIS_URL
from tests.durable import RedisServer
from tests.proxy import Proxy


@pytest.fixture
def sqlite_suite(broker, sqlite_url, key_prefix) -> Iterator[dramatiq_unique.Suite]:
    suite = dramatiq_unique.setup(broker, database=sqlite_url, redis=REDIS_URL, key_prefix=key_prefix,
                                  redriver=False)
    yield suite
    suite.db.close()


class LoseNextReply:
    """Make the next reply read on ``client``'s link of this thread vanish after the server sent
    it, as a connection reset between the server's reply and our read would."""

    def __init__(self, client: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
        self.link = scripts.link_of(client)
        self.link.call_all([("PING",)])  # an open connection that answered: a break on it is what a resend is for
        self.lost = 0
        conn = self.link.conn
        read = conn.read_response

        def read_then_break(*args: Any, **kwargs: Any) -> Any:
            with contextlib.suppress(redis.ResponseError):  # an error reply is a reply lost all the same
                read(*args, **kwargs)  # the server ran the call and replied
            self.lost += 1
            monkeypatch.setattr(conn, "read_response", read)  # only once
            conn.disconnect()  # what redis-py does when its socket fails
            raise redis.ConnectionError("Error while reading: connection reset after the reply was sent")

        monkeypatch.setattr(conn, "read_response", read_then_break)


# -- each lock script, twice ---------------------------------------------------------------------


def test_lock_scripts_repeated_with_the_same_token_are_harmless(redis_client, key_prefix):
    locks = Locks([redis_client])
    name, token, fresh = f"{key_prefix}:lock", new_token(), new_token()
    assert locks.acquire(name, 5_000, token) == (token, None)
    assert locks.acquire(name, 5_000, token) == (token, None), "its own lock: taken, not foreign"
    assert locks.acquire(name, 5_000, new_token()) == (None, token), "another token still finds it held"
    assert locks.extend(name, token, 5_000) and locks.extend(name, token, 5_000)
    assert locks.transfer(name, token, fresh, 5_000)
    assert locks.transfer(name, token, fresh, 5_000), "a repeated transfer finds the new token there"
    assert redis_client.get(f"{LOCK_PREFIX}:{name}") == fresh.encode()
    assert not locks.transfer(name, new_token(), new_token(), 5_000), "a stranger still cannot"
    assert locks.release(name, fresh) and not locks.release(name, fresh), "a repeat finds it free"
    assert locks.pttl(name) == 0
    locks.force([(name, token, 5_000)])
    locks.force([(name, token, 5_000)])
    assert redis_client.get(f"{LOCK_PREFIX}:{name}") == token.encode()
    flags = f"{key_prefix}:flags"
    redis_client.zadd(flags, {"lock:x": 1})
    assert locks.release_unless(name, token, flags, "lock:x") == KEPT
    assert locks.release_unless(name, token, flags, "lock:x") == KEPT
    redis_client.delete(flags)
    assert locks.release_unless(name, token, flags, "lock:x") == RELEASED
    assert locks.release_unless(name, token, flags, "lock:x") == NOT_HELD


# -- each slot script, twice ---------------------------------------------------------------------


def test_slot_scripts_repeated_with_the_same_token_take_no_second_slot(sqlite_suite):
    gate, group = gate_of(sqlite_suite), "slot:repeats:all"
    a, b = new_token(), new_token()
    assert gate.enter(group, a, 5_000, 1, None) == (True, 0)
    assert gate.enter(group, a, 5_000, 1, None) == (True, 0), "its own slot: in, not full"
    assert gate.status(group, 1)[0] == 1, "one slot, not two"
    assert gate.enter(group, b, 5_000, 1, None)[0] is False, "the group is still full for others"
    # A hand-over, twice: the second finds the slot already with the new token.
    pass_args = [1, a, b, 5_000]
    assert gate._call("pass", group, pass_args) == 1
    assert gate._call("pass", group, pass_args) == 1
    assert gate.status(group, 1)[0] == 1
    # A leave that re-issues the slot to a woken job's token, twice (someone is flagged).
    c = new_token()
    sqlite_suite.redis.zadd(gate.flags, {group: 0})
    leave_args = [1, b, group, c, 5_000]
    assert gate._call("leave", group, leave_args, (gate.flags,)) == KEPT
    assert gate._call("leave", group, leave_args, (gate.flags,)) == KEPT, "handed on: not 'not held'"
    assert gate.status(group, 1)[0] == 1
    # Flag-and-take of a free slot, twice: one slot.
    gate.release(group, c)
    d = new_token()
    take_args = [1, d, 5_000, group, 0]
    assert gate._call("flag_and_take", group, take_args, (gate.flags,)) == 1
    assert gate._call("flag_and_take", group, take_args, (gate.flags,)) == 1
    assert gate.status(group, 1)[0] == 1
    # Renew twice; a plain leave twice ("not held" the second time: the caller only looks for waiters).
    assert gate.renew(group, d, 5_000, 1) and gate.renew(group, d, 5_000, 1)
    sqlite_suite.redis.zrem(gate.flags, group)
    assert gate.hand_over(group, d)[0] == RELEASED
    assert gate.hand_over(group, d)[0] == NOT_HELD
    assert gate.status(group, 1)[0] == 0


def test_a_repeated_enter_after_a_reservation_is_still_one_slot(sqlite_suite):
    gate, group = gate_of(sqlite_suite), "slot:reserved:all"
    reserved, mine = new_token(), new_token()
    assert gate.enter(group, reserved, 5_000, 1, None)[0]
    assert gate.enter(group, mine, 5_000, 1, reserved) == (True, 0), "takes up the reservation"
    assert gate.enter(group, mine, 5_000, 1, reserved) == (True, 0)
    assert gate.status(group, 1)[0] == 1


def test_a_repeated_pass_and_deliver_writes_nothing_twice(sqlite_suite, redis_client, key_prefix):
    gate, group = gate_of(sqlite_suite), "slot:deliver:all"
    a, b = new_token(), new_token()
    assert gate.enter(group, a, 5_000, 1, None)[0]
    keys = [f"{key_prefix}:msgs", f"{key_prefix}:acks"]
    assert gate.pass_and_deliver(group, a, b, 5_000, keys, ["m1", "body"])
    redis_client.hdel(keys[0], "m1")  # the woken message was taken meanwhile
    redis_client.srem(keys[1], "m1")
    assert gate.pass_and_deliver(group, a, b, 5_000, keys, ["m1", "body"]), "the repeat: handed on"
    assert redis_client.hlen(keys[0]) == 0 and redis_client.scard(keys[1]) == 0, "not delivered again"
    assert gate.status(group, 1)[0] == 1


# -- the lost reply itself -----------------------------------------------------------------------


def test_an_acquire_whose_reply_was_lost_is_sent_again_and_finds_the_lock_its_own(redis_client, key_prefix,
                                                                                    monkeypatch):
    locks = Locks([redis_client])
    name, token = f"{key_prefix}:lost", new_token()
    lose = LoseNextReply(redis_client, monkeypatch)
    assert locks.acquire(name, 5_000, token) == (token, None)
    assert lose.lost == 1, "the first reply was lost, the call sent again"
    assert redis_client.get(f"{LOCK_PREFIX}:{name}") == token.encode()


def test_a_slot_enter_whose_reply_was_lost_takes_one_slot(sqlite_suite, monkeypatch):
    gate, group = gate_of(sqlite_suite), "slot:lost:all"
    token = new_token()
    lose = LoseNextReply(sqlite_suite.redis, monkeypatch)
    assert gate.enter(group, token, 5_000, 1, None) == (True, 0)
    assert lose.lost == 1 and gate.status(group, 1)[0] == 1


def test_a_transfer_whose_reply_was_lost_on_one_redlock_master_still_counts(monkeypatch):
    servers = [RedisServer().start() for _ in range(3)]
    try:
        locks = Locks([redis.Redis.from_url(s.url) for s in servers])
        token, _ = locks.acquire("job", 5_000)
        assert token is not None
        fresh = new_token()
        # Lost on two masters of three: without the repeat's own check only one would count.
        losses = [LoseNextReply(node.client, monkeypatch) for node in locks.nodes[:2]]
        assert locks.transfer("job", token, fresh, 5_000)
        assert [lose.lost for lose in losses] == [1, 1]
        assert locks.extend("job", fresh, 5_000) and not locks.extend("job", token, 5_000)
        losses = [LoseNextReply(node.client, monkeypatch) for node in locks.nodes[1:]]
        again = new_token()
        assert locks.acquire("other", 5_000, again) == (again, None), "its own lock on two masters: taken"
        assert [lose.lost for lose in losses] == [1, 1]
    finally:
        for server in servers:
            server.stop()


@pytest.mark.parametrize("made_by", ["from_url", "Redis"])
def test_a_script_is_not_sent_again_over_a_connection_that_never_opened(made_by, monkeypatch):
    """Given a server that is down, Then a call fails after one connection attempt: no resend of
    ours, and none of redis-py's (``redis.Redis(...)`` comes with retries and back-off)."""
    server = RedisServer().start()
    if made_by == "from_url":
        client = redis.Redis.from_url(server.url, socket_connect_timeout=0.5)
    else:
        client = redis.Redis(host="127.0.0.1", port=server.port, socket_connect_timeout=0.5)
    server.stop()
    script = scripts.Script(client, "return 1")
    conn = scripts.link_of(client).conn
    connects = []
    real = conn._connect  # redis-py's own: one socket opened per call of it
    monkeypatch.setattr(conn, "_connect", lambda: (connects.append(1), real())[1])
    with pytest.raises(redis.ConnectionError):
        script()
    assert len(connects) == 1



@pytest.fixture
def proxy() -> Iterator[tuple[Proxy, RedisServer]]:
    server = RedisServer().start()
    lossy = Proxy(server.port)
    try:
        yield lossy, server
    finally:
        lossy.close()
        server.stop()


def test_over_the_network_a_lost_acquire_reply_is_sent_again_and_the_lock_is_its_own(proxy):
    lossy, server = proxy
    locks = Locks([redis.Redis(port=lossy.port)])
    direct = redis.Redis(port=server.port)
    assert locks.acquire("warm", 1_000)[0]  # the connection is open: a break on it is resent
    token = new_token()
    lossy.armed = True
    assert locks.acquire("job", 5_000, token) == (token, None)
    assert lossy.lost == 1 and direct.get(f"{LOCK_PREFIX}:job") == token.encode()
    fresh = new_token()
    lossy.armed = True
    assert locks.transfer("job", token, fresh, 5_000), "a lost transfer's repeat finds the new token"
    assert lossy.lost == 2 and direct.get(f"{LOCK_PREFIX}:job") == fresh.encode()


def test_over_the_network_a_lost_slot_enter_reply_takes_one_slot(broker, sqlite_url, key_prefix, proxy):
    lossy, _ = proxy
    suite = dramatiq_unique.setup(broker, database=sqlite_url, redis=f"redis://127.0.0.1:{lossy.port}/0",
                                  key_prefix=key_prefix, redriver=False)
    try:
        gate, group = gate_of(suite), "slot:network:all"
        # The connection is open and the server knows the script (a lost NOSCRIPT would prove nothing).
        assert gate.enter("slot:warm:all", new_token(), 1_000, 1, None)[0]
        lossy.armed = True
        assert gate.enter(group, new_token(), 5_000, 1, None) == (True, 0)
        assert lossy.lost == 1 and gate.status(group, 1)[0] == 1, "one slot, not two"
        assert gate.enter(group, new_token(), 5_000, 1, None)[0] is False
    finally:
        suite.db.close()
