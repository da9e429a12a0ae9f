"""Which Redis server a client talks to (Sentinel URLs included: docs/operations/deploying.md), and the
one-time check of the suite's servers at set-up: one ``PING`` each over a fresh, bounded connection."""

from __future__ import annotations

import contextlib
import logging
from typing import Any, Optional, Sequence
from urllib.parse import parse_qs, unquote, urlparse

import redis as redis_lib
from redis.backoff import NoBackoff
from redis.retry import Retry
from redis.sentinel import MasterNotFoundError, Sentinel, SentinelConnectionPool

from dramatiq_unique.errors import InvalidOption, RedisUnavailable

logger = logging.getLogger(__name__)

#: URL schemes of a service behind Sentinel (``rediss+``: TLS to the master).
SENTINEL_SCHEMES = ("redis+sentinel", "rediss+sentinel")
#: Query parameters read as seconds.
_FLOATS = ("socket_timeout", "socket_connect_timeout")
#: Connection settings that belong to a pool itself (redis-py 7+'s maintenance notifications) or that
#: redis-py derives again: not copied to a pool derived from it (a Sentinel pool sets its own link back).
_POOL_OWN = ("maint_notifications_pool_handler", "maint_notifications_config", "himport_registry",
             "orig_host_address", "orig_socket_timeout", "orig_socket_connect_timeout")
#: Query parameters given to the master's connections as they are.
_SSL = ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_cert_reqs", "ssl_ca_path", "ssl_check_hostname")


def is_sentinel_url(url: str) -> bool:
    return urlparse(url).scheme in SENTINEL_SCHEMES


def client_from_url(url: str, **kwargs: Any) -> redis_lib.Redis:
    """A client for ``url``: ``redis://``, ``rediss://``, ``unix://`` (redis-py's own) or a Sentinel URL
    (see the module's docs).  ``kwargs`` go to the client's connections, as ``Redis.from_url`` takes them."""
    if not is_sentinel_url(url):
        return redis_lib.Redis.from_url(url, **kwargs)
    parsed = urlparse(url)
    hosts = []
    netloc = parsed.netloc.rsplit("@", 1)[-1]
    for item in netloc.split(","):
        host, _, port = item.rpartition(":")
        if not host:
            host, port = item, "26379"
        try:
            hosts.append((host.strip("[]"), int(port)))
        except ValueError:
            raise InvalidOption(f"Sentinel URL: {item!r} is not host:port") from None
    parts = [unquote(p) for p in parsed.path.split("/") if p]
    if not parts or len(parts) > 2 or not hosts:
        raise InvalidOption("a Sentinel URL is redis+sentinel://host:port[,host:port...]/service[/db]")
    try:
        db = int(parts[1]) if len(parts) == 2 else 0
    except ValueError:
        raise InvalidOption(f"Sentinel URL: database {parts[1]!r} is not a number") from None
    query = {key: values[-1] for key, values in parse_qs(parsed.query).items()}
    master: dict[str, Any] = {"db": db}
    if parsed.username:
        master["username"] = unquote(parsed.username)
    if parsed.password:
        master["password"] = unquote(parsed.password)
    common: dict[str, Any] = {name: float(query[name]) for name in _FLOATS if name in query}
    if parsed.scheme.startswith("rediss"):
        master["ssl"] = True
        master.update({name: query[name] for name in _SSL if name in query})
        if "ssl_check_hostname" in master:
            master["ssl_check_hostname"] = master["ssl_check_hostname"].lower() in ("1", "true", "yes")
    sentinel_kwargs: dict[str, Any] = {**common, **{name: query[f"sentinel_{name}"] for name in ("username", "password")
                                                    if f"sentinel_{name}" in query}}
    if query.get("sentinel_ssl", "").lower() in ("1", "true", "yes"):
        sentinel_kwargs["ssl"] = True
        sentinel_kwargs.update({name: query[name] for name in _SSL if name in query and name != "ssl_check_hostname"})
    sentinel = Sentinel(hosts, sentinel_kwargs=sentinel_kwargs, **{**common, **kwargs})
    return sentinel.master_for(parts[0], **master)


def identity(client: Any) -> tuple:
    """What names the server (and database) that ``client`` talks to (see the module's docs)."""
    pool = client.connection_pool
    kwargs = pool.connection_kwargs
    if isinstance(pool, SentinelConnectionPool):
        sentinels = frozenset(_address(s) for s in getattr(pool.sentinel_manager, "sentinels", ()))
        return ("sentinel", pool.service_name, sentinels, kwargs.get("db", 0))
    return (kwargs.get("host"), kwargs.get("port"), kwargs.get("path"), kwargs.get("db", 0))


def _address(client: Any) -> tuple:
    kwargs = client.connection_pool.connection_kwargs
    return (kwargs.get("host"), kwargs.get("port"))


def describe(client: Any) -> Optional[str]:
    """``redis+sentinel://host:port,.../service/db`` for a Sentinel client (no credentials); None for another."""
    pool = client.connection_pool
    if not isinstance(pool, SentinelConnectionPool):
        return None
    hosts = ",".join(f"{host}:{port}" for host, port in sorted(identity(client)[2], key=str))
    scheme = "rediss+sentinel" if pool.connection_kwargs.get("ssl") or "SSL" in pool.connection_class.__name__ \
        else "redis+sentinel"
    return f"{scheme}://{hosts}/{pool.service_name}/{pool.connection_kwargs.get('db', 0)}"


def address(client: redis_lib.Redis) -> str:
    """Where a client points, without credentials: ``redis://host:port/db`` (``rediss``, ``unix``, Sentinel)."""
    sentinel = describe(client)
    if sentinel is not None:
        return sentinel
    kwargs: dict[str, Any] = client.connection_pool.connection_kwargs
    db = kwargs.get("db", 0)
    if kwargs.get("path"):
        return f"unix://{kwargs['path']}?db={db}"
    scheme = "rediss" if issubclass(client.connection_pool.connection_class, redis_lib.SSLConnection) else "redis"
    return f"{scheme}://{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}/{db}"


def connection_settings(pool: Any) -> dict[str, Any]:
    """The settings of ``pool``'s connections, for a pool derived from it."""
    return {key: value for key, value in pool.connection_kwargs.items() if key not in _POOL_OWN}


def ping(client: redis_lib.Redis, timeout_ms: float, role: str) -> None:
    """One PING over a new connection bounded by ``timeout_ms`` (behind Sentinel: to the master the sentinels
    name now, each asked once within it); RedisUnavailable if it fails."""
    pool: Any = client.connection_pool
    seconds = timeout_ms / 1000
    bounded = {"socket_timeout": seconds, "socket_connect_timeout": seconds, "retry": Retry(NoBackoff(), 0)}
    kwargs: dict[str, Any] = {**connection_settings(pool), **bounded, "retry_on_error": [], "retry_on_timeout": False}
    cls, sentinels, checked = pool.connection_class, [], client
    if isinstance(pool, SentinelConnectionPool):
        asked = {**pool.sentinel_manager.sentinel_kwargs, **bounded}
        probe = Sentinel([_address(s) for s in pool.sentinel_manager.sentinels], sentinel_kwargs=asked)
        sentinels, checked = probe.sentinels, probe.master_for(pool.service_name, connection_class=cls, **kwargs)
    else:
        with contextlib.suppress(Exception):  # a pool of an unusual kind (its class takes other settings): as it is
            cls(**kwargs)  # nothing connects yet
            checked = redis_lib.Redis(connection_pool=redis_lib.ConnectionPool(connection_class=cls, **kwargs))
    try:
        checked.ping()
        if (master := replica_of(checked)) is not None:
            raise RedisUnavailable(f"{role} at {address(client)} is a replica of {master}: the suite's "
                                   "locks must be written on a master; name the master (or its Sentinels) in the URL")
        if (risk := eviction(checked)) is not None:
            logger.warning("%s at %s: %s", role, address(client), risk)
    except MasterNotFoundError as e:
        raise RedisUnavailable(
            f"{role} at {address(client)}: no sentinel named a master of service {pool.service_name!r} within "
            f"{timeout_ms:g} ms ({type(e).__name__}); are the sentinels running, and is the URL right?"
        ) from e
    except (redis_lib.RedisError, OSError) as e:
        raise RedisUnavailable(
            f"{role} at {address(client)} did not answer a PING within {timeout_ms:g} ms ({e}); "
            "is the server running, and is the URL right?"
        ) from e
    finally:
        for opened in (checked, *sentinels):
            if opened is not client:
                opened.close()


def _info(client: redis_lib.Redis, section: str) -> Optional[dict]:
    """``INFO section``; None where it is refused (an ACL without INFO, a managed server's renamed command)."""
    try:
        return client.info(section)
    except redis_lib.ResponseError:
        return None


def replica_of(client: redis_lib.Redis) -> Optional[str]:
    """The master (``host:port``) of a server that is a replica, whose writes (where it takes any) never reach
    its master; None for a master, or a server that does not say (``INFO`` refused)."""
    replication = _info(client, "replication")
    if replication is None or replication.get("role") != "slave":
        return None
    return f"{replication.get('master_host')}:{replication.get('master_port')}"


def eviction(client: redis_lib.Redis) -> Optional[str]:
    """What a server that may evict keys risks (a memory limit with a policy other than ``noeviction``);
    None if it evicts nothing, or does not say (``INFO`` refused)."""
    memory = _info(client, "memory")
    if memory is None:
        return None
    policy, limit = memory.get("maxmemory_policy", "noeviction"), int(memory.get("maxmemory") or 0)
    if not limit or policy == "noeviction":
        return None
    return (f"maxmemory {limit} B with maxmemory-policy {policy}: when it is full, Redis drops keys, locks and "
            "queued messages among them (a job may then run beside itself, or a message be lost); "
            "set maxmemory-policy noeviction")


def check_redis(masters: Sequence[redis_lib.Redis], broker_client: Optional[Any], timeout_ms: float) -> None:
    """PING each Redis master of the suite (a majority must answer, as a lock needs; the others are logged),
    and the broker's Redis if it is another server."""
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
