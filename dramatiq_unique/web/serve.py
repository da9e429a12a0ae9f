"""Running the dashboard on its own (``python -m dramatiq_unique web APP``): on waitress (the ``web``
extra), a production server, as Flask's documentation recommends."""

from __future__ import annotations

import ipaddress
import logging
import os
from typing import TYPE_CHECKING, Any, Optional

import waitress.server  # type: ignore[import-untyped]

from dramatiq_unique.errors import InvalidOption
from dramatiq_unique.web.app import make_app
from dramatiq_unique.web.security import BasicAuth

if TYPE_CHECKING:
    from dramatiq_unique.suite import Suite

logger = logging.getLogger(__name__)

#: ``user:password`` for basic auth, read when ``serve()`` is given none: a password on the
#: command line would show in ``ps``.
AUTH_ENV = "DRAMATIQ_UNIQUE_WEB_AUTH"


def exposed(host: str, *, guarded: bool, read_only: bool, allow_anonymous: bool) -> bool:
    """Whether serving on ``host`` would let anyone who reaches it act: not loopback, no basic auth
    or hook (``guarded``), not read-only, and anonymous access not asked for."""
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name
        loopback = False
    return not loopback and not guarded and not read_only and not allow_anonymous


def basic_auth_from_env() -> Optional[tuple[str, str]]:
    value = os.environ.get(AUTH_ENV)
    if not value:
        return None
    user, sep, password = value.partition(":")
    if not sep or not user or not password:
        raise InvalidOption(f"{AUTH_ENV} must read user:password")
    return user, password


def make_server(
    suite: "Optional[Suite]" = None, *, host: str = "127.0.0.1", port: int = 8080, read_only: bool = False,
    basic_auth: Optional[BasicAuth] = None, allow_anonymous: bool = False, threads: int = 4, **app_options: Any,
) -> Any:
    """The standalone server, bound but not yet serving (``.run()``, ``.close()``, ``.port``); off loopback
    it refuses to start with actions open to anyone (:func:`exposed`).  Other options go to ``make_app``."""
    basic_auth = basic_auth_from_env() if basic_auth is None else basic_auth
    guarded = basic_auth is not None or app_options.get("auth") is not None
    if exposed(host, guarded=guarded, read_only=read_only, allow_anonymous=allow_anonymous):
        raise InvalidOption(f"serving the dashboard on {host} lets anyone who reaches it retry, cancel and halt jobs: "
                            f"set basic_auth (or {AUTH_ENV}=user:password), read_only=True, or allow_anonymous=True")
    app = make_app(suite, read_only=read_only, basic_auth=basic_auth, **app_options)
    # poll(), not select(): select() fails on a descriptor above 1023, which a host process may hold.
    server: Any = waitress.server.create_server(app, host=host, port=port, threads=threads, ident="dramatiq_unique",
                                                asyncore_use_poll=True)
    server.port = server.effective_port
    logger.info("Dashboard on http://%s:%s/%s", host, server.port, " (read-only)" if read_only else "")
    return server


def serve(suite: "Optional[Suite]" = None, **options: Any) -> None:
    """Serve the dashboard until interrupted (Ctrl-C; SIGTERM ends the process); ``options`` are
    :func:`make_server`'s."""
    server = make_server(suite, **options)
    try:
        server.run()
    except KeyboardInterrupt:
        pass
    finally:
        server.close()
