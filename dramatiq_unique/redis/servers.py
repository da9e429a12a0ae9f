"""Which Redis server a client talks to: clients from URLs, Sentinel's included (the URL's form is in
docs/operations/deploying.md), and server identity: two clients reach one server when they name the same
host, port (or socket) and database, or the same service and database through the same sentinels."""

from __future__ import annotations

from typing import Any, Optional
from urllib.parse import parse_qs, unquote, urlparse

import redis as redis_lib
from redis.sentinel import Sentinel, SentinelConnectionPool

from dramatiq_unique.errors import InvalidOption

#: URL schemes of a service behind Sentinel (``rediss+``: TLS to the master).
SENTINEL_SCHEMES = ("redis+sentinel", "rediss+sentinel")
#: Query parameters read as seconds.
_FLOATS = ("socket_timeout", "socket_connect_timeout")
#: Query parameters given to the master's connections as they are.
_SSL = ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_cert_reqs", "ssl_ca_path", "ssl_check_hostname")


def is_sentinel_url(url: str) -> bool:
    return urlparse(url).scheme in SENTINEL_SCHEMES


def client_from_url(url: str, **kwargs: Any) -> redis_lib.Redis:
    """A client for ``url``: ``redis://``, ``rediss://``, ``unix://`` (redis-py's own) or a Sentinel URL
    (see the module's docs).  ``kwargs`` go to the client's connections, as ``Redis.from_url`` takes them."""
    if not is_sentinel_url(url):
        return redis_lib.Redis.from_url(url, **kwargs)
    return sentinel_client(url, **kwargs)


def sentinel_client(url: str, **kwargs: Any) -> redis_lib.Redis:
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
    service = parts[0]
    try:
        db = int(parts[1]) if len(parts) == 2 else 0
    except ValueError:
        raise InvalidOption(f"Sentinel URL: database {parts[1]!r} is not a number") from None
    query = {key: values[-1] for key, values in parse_qs(parsed.query).items()}
    master: dict[str, Any] = {"db": db}
    if "@" in parsed.netloc:
        who = parsed.netloc.rsplit("@", 1)[0]
        user, _, password = who.partition(":")
        if user:
            master["username"] = unquote(user)
        if password:
            master["password"] = unquote(password)
    common: dict[str, Any] = {name: float(query[name]) for name in _FLOATS if name in query}
    if parsed.scheme.startswith("rediss"):
        master["ssl"] = True
        master.update({name: query[name] for name in _SSL if name in query})
        if "ssl_check_hostname" in master:
            master["ssl_check_hostname"] = master["ssl_check_hostname"].lower() in ("1", "true", "yes")
    sentinel_kwargs: dict[str, Any] = dict(common)
    for name in ("username", "password"):
        if f"sentinel_{name}" in query:
            sentinel_kwargs[name] = query[f"sentinel_{name}"]
    if query.get("sentinel_ssl", "").lower() in ("1", "true", "yes"):
        sentinel_kwargs["ssl"] = True
        sentinel_kwargs.update({name: query[name] for name in _SSL if name in query and name != "ssl_check_hostname"})
    sentinel = Sentinel(hosts, sentinel_kwargs=sentinel_kwargs, **{**common, **kwargs})
    return sentinel.master_for(service, **master)


def identity(client: Any) -> tuple:
    """What names the server (and database) that ``client`` talks to (see the module's docs)."""
    pool = client.connection_pool
    kwargs = pool.connection_kwargs
    if isinstance(pool, SentinelConnectionPool):
        manager = pool.sentinel_manager
        sentinels = frozenset(_address(s) for s in getattr(manager, "sentinels", ()))
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


def discover_master(client: Any, timeout_ms: float) -> tuple[str, int]:
    """The address of the master that a Sentinel client's sentinels name now, each asked within
    ``timeout_ms`` and once (not with their clients' own timeouts and retries)."""
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    pool = client.connection_pool
    manager = pool.sentinel_manager
    seconds = timeout_ms / 1000
    kwargs = {**manager.sentinel_kwargs, "socket_timeout": seconds, "socket_connect_timeout": seconds,
              "retry": Retry(NoBackoff(), 0)}
    probe = Sentinel([_address(s) for s in manager.sentinels], sentinel_kwargs=kwargs)
    try:
        host, port = probe.discover_master(pool.service_name)
        return str(host), int(port)
    finally:
        for sentinel in probe.sentinels:
            sentinel.close()
