"""Redis clients from URLs, Sentinel's included, and which server a client names (no server needed)."""

from __future__ import annotations

import pytest
import redis
from redis.sentinel import SentinelConnectionPool

from dramatiq_unique import InvalidOption, redis_client
from dramatiq_unique.redis.servers import address, describe, identity, is_sentinel_url


def test_a_sentinel_url_gives_a_client_of_the_services_master():
    client = redis_client("redis+sentinel://:secret@10.0.0.1:26379,10.0.0.2:26380,sentinel-3/billing/2"
                          "?socket_timeout=1.5&sentinel_password=s3")
    pool = client.connection_pool
    assert isinstance(pool, SentinelConnectionPool) and pool.service_name == "billing"
    assert pool.connection_kwargs["db"] == 2 and pool.connection_kwargs["password"] == "secret"
    assert pool.connection_kwargs["socket_timeout"] == 1.5
    sentinels = pool.sentinel_manager.sentinels
    assert [s.connection_pool.connection_kwargs["port"] for s in sentinels] == [26379, 26380, 26379]
    assert all(s.connection_pool.connection_kwargs["password"] == "s3" for s in sentinels)
    assert describe(client) == address(client) == (
        "redis+sentinel://10.0.0.1:26379,10.0.0.2:26380,sentinel-3:26379/billing/2")  # no password


def test_rediss_sentinel_speaks_tls_to_the_master():
    client = redis_client("rediss+sentinel://h:26379/svc?ssl_ca_certs=/ca.crt")
    assert "SSL" in client.connection_pool.connection_class.__name__
    assert client.connection_pool.connection_kwargs["ssl_ca_certs"] == "/ca.crt"
    assert describe(client).startswith("rediss+sentinel://")


@pytest.mark.parametrize("url", ["redis+sentinel://h:26379/", "redis+sentinel://h:x/svc",
                                 "redis+sentinel://h:26379/svc/zero", "redis+sentinel://h:1/a/1/2"])
def test_a_bad_sentinel_url_is_refused(url):
    with pytest.raises(InvalidOption):
        redis_client(url)


def test_identity_names_the_server_or_the_service():
    a, b = redis_client("redis://127.0.0.1:6379/0"), redis.Redis(host="127.0.0.1", port=6379)
    assert identity(a) == identity(b) != identity(redis_client("redis://127.0.0.1:6379/1"))
    one = redis_client("redis+sentinel://h1:1,h2:2/svc/0")
    assert identity(one) == identity(redis_client("redis+sentinel://h2:2,h1:1/svc/0"))
    assert identity(one) != identity(redis_client("redis+sentinel://h1:1,h2:2/other/0"))
    assert identity(one) != identity(a)
    assert not is_sentinel_url("redis://h/0") and is_sentinel_url("redis+sentinel://h/svc")
    assert describe(a) is None


def test_sentinels_that_name_no_master_are_said_so_at_the_check():
    """setup()'s check asks each sentinel once within check_timeout (not with their clients' own five
    seconds and retries) and says that no sentinel named a master, without a wall of client reprs."""
    from dramatiq_unique import RedisUnavailable
    from dramatiq_unique.redis.servers import ping

    with pytest.raises(RedisUnavailable, match="no sentinel named a master of service 'svc' within 500 ms") as error:
        ping(redis_client("redis+sentinel://127.0.0.1:1,127.0.0.1:2/svc/0"), 500, "Redis")
    assert len(str(error.value)) < 300
