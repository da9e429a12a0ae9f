"""The one-time check of the suite's Redis servers at :func:`dramatiq_unique.setup`: one ``PING`` each,
over a fresh connection bounded by ``check_timeout`` with no retries, whatever the client carries."""

from __future__ import annotations

import logging
from typing import Any, Optional, Sequence

import redis as redis_lib
from redis.backoff import NoBackoff
from redis.retry import Retry
from redis.sentinel import SentinelConnectionPool

from dramatiq_unique.errors import RedisUnavailable
from dramatiq_unique.redis.servers import describe, discover_master

logger = logging.getLogger(__name__)


def address(client: redis_lib.Redis) -> str:
    """Where a client points: ``redis://host:port/db`` (``rediss://``, ``unix://``, ``redis+sentinel://``),
    without credentials."""
    sentinel = describe(client)
    if sentinel is not None:
        return sentinel
    kwargs: dict[str, Any] = client.connection_pool.connection_kwargs
    db = kwargs.get("db", 0)
    if kwargs.get("path"):
        return f"unix://{kwargs['path']}?db={db}"
    scheme = "rediss" if issubclass(client.connection_pool.connection_class, redis_lib.SSLConnection) else "redis"
    return f"{scheme}://{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}/{db}"


def ping(client: redis_lib.Redis, timeout_ms: float, role: str) -> None:
    """One PING over a new connection bounded by ``timeout_ms``; RedisUnavailable if it fails."""
    pool = client.connection_pool
    seconds = timeout_ms / 1000
    bounded = {"socket_timeout": seconds, "socket_connect_timeout": seconds,
               "retry": Retry(NoBackoff(), 0), "retry_on_error": [], "retry_on_timeout": False}
    try:
        if isinstance(pool, SentinelConnectionPool):
            conn = _sentinel_master(client, timeout_ms, role, bounded)
        else:
            conn = pool.connection_class(**{**pool.connection_kwargs, **bounded})
    except RedisUnavailable:
        raise
    except Exception:  # a pool of an unusual kind: ask the client itself
        conn = None
    try:
        if conn is None:
            client.ping()
            return
        conn.connect()
        conn.send_command("PING")
        conn.read_response()
    except (redis_lib.RedisError, OSError) as e:
        raise RedisUnavailable(
            f"{role} at {address(client)} did not answer a PING within {timeout_ms:g} ms ({e}); "
            "is the server running, and is the URL right?"
        ) from e
    finally:
        if conn is not None:
            conn.disconnect()


def _sentinel_master(client: redis_lib.Redis, timeout_ms: float, role: str, bounded: dict[str, Any]) -> Any:
    """A connection to the master the sentinels name now, each asked within ``timeout_ms`` (not with the
    sentinels' own timeouts and retries); RedisUnavailable, saying so, if none names one."""
    pool: Any = client.connection_pool
    try:
        host, port = discover_master(client, timeout_ms)
    except (redis_lib.RedisError, OSError) as e:
        raise RedisUnavailable(
            f"{role} at {address(client)}: no sentinel named a master of service {pool.service_name!r} within "
            f"{timeout_ms:g} ms ({type(e).__name__}); are the sentinels running, and is the URL right?"
        ) from e
    kwargs = {key: value for key, value in pool.connection_kwargs.items() if key != "connection_pool"}
    connection_class = redis_lib.SSLConnection if "SSL" in pool.connection_class.__name__ else redis_lib.Connection
    return connection_class(**{**kwargs, **bounded, "host": host, "port": port})


def check_redis(masters: Sequence[redis_lib.Redis], broker_client: Optional[Any], timeout_ms: float) -> None:
    """PING each Redis master of the suite, and the broker's Redis if it is another server.

    One master must answer; of several (Redlock), a majority, as a lock needs: a master of
    three that is down is only logged.
    """
    seen, down = set(), []
    for client in masters:
        seen.add(address(client))
        try:
            ping(client, timeout_ms, "Redis (the suite's locks and slots)")
        except RedisUnavailable as e:
            down.append(e)
    if len(down) > (len(masters) - 1) // 2:  # the quorum (a majority) of masters is not there
        raise down[0]
    for error in down:
        logger.warning("%s; a lock needs a majority of the %d masters.", error, len(masters))
    if isinstance(broker_client, redis_lib.Redis) and address(broker_client) not in seen:
        ping(broker_client, timeout_ms, "Redis (the broker's)")
