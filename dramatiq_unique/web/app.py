"""The dashboard's Flask app (:func:`make_app`): a WSGI callable that mounts under any path of a WSGI
host, or of an ASGI one through an adapter (links are built with ``url_for``, which honours
``SCRIPT_NAME``); and :func:`serve`, which runs it on its own (``python -m dramatiq_unique web APP``)
on waitress (the ``web`` extra), a production server, as Flask's documentation recommends."""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import secrets
from typing import Any, Optional, Union

import redis as redis_lib
import waitress.server  # type: ignore[import-untyped]
from flask import Flask, Response, render_template, request
from werkzeug.exceptions import HTTPException

from dramatiq_unique.errors import DependencyUnavailable, InvalidOption, NotConfigured
from dramatiq_unique.logs import RedactPasswords
from dramatiq_unique.redaction import redact
from dramatiq_unique.suite import Suite
from dramatiq_unique.web import actions, pages, security
from dramatiq_unique.web.security import Access, AuthHook, BasicAuth, check_access, csrf_token, set_cookie

logger = logging.getLogger(__name__)

#: Every response's headers.  No script runs on these pages, and none may be injected: a strict policy costs nothing.
HEADERS = {
    "Content-Security-Policy": "default-src 'none'; style-src 'self'; img-src 'self' data:; form-action 'self'; "
                               "frame-ancestors 'self'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff", "Referrer-Policy": "same-origin", "Cache-Control": "no-store",
}


def make_app(
    suite: "Optional[Suite]" = None, *, read_only: bool = False, auth: Optional[AuthHook] = None,
    basic_auth: Optional[BasicAuth] = None, secret_key: Union[str, bytes, None] = None,
    title: str = "dramatiq_unique", page_size: int = 50,
) -> Flask:
    """The dashboard as a WSGI app (a :class:`flask.Flask`) showing ``suite`` (default: the last
    ``setup()``'s, looked up at each request), its pages headed ``title``, ``page_size`` rows a page (1 to
    1000); docs/operations/dashboard.md explains the access options."""
    if auth is not None and not callable(auth):
        raise InvalidOption(f"auth must be a callable auth(request, action) -> bool, not {auth!r}")
    if basic_auth is not None and not callable(basic_auth) and not (
        isinstance(basic_auth, tuple) and len(basic_auth) == 2 and all(isinstance(x, str) and x for x in basic_auth)
    ):  # an empty user or password would let in anyone who sends ":"
        raise InvalidOption("basic_auth must be (user, password), both non-empty str, or a callable(user, password)")
    if isinstance(page_size, bool) or not isinstance(page_size, int) or not 1 <= page_size <= 1000:
        raise InvalidOption(f"page_size must be an int from 1 to 1000, not {page_size!r}")
    key = secret_key.encode() if isinstance(secret_key, str) else secret_key
    secret = bytes(key) if key else secrets.token_bytes(32)
    access = Access(read_only=read_only, auth=auth, basic_auth=basic_auth, secret=secret)
    RedactPasswords.install()  # the dashboard may run in a process that has not called setup()

    app = Flask(__name__)  # its templates/ and static/ (at /static), by default
    app.config.update(DU_ACCESS=access, DU_SUITE=suite, DU_PAGE_SIZE=page_size,
                      MAX_CONTENT_LENGTH=64 * 1024)  # our forms are tiny: a huge POST is refused early
    app.jinja_env.autoescape = True  # every template, whatever its name: job arguments are user data
    app.jinja_env.filters.update(pages.FILTERS)

    @app.before_request
    def _guard() -> Optional[Response]:
        return check_access(access, actions.ACTION_OF.get(request.endpoint or ""))

    @app.after_request
    def _headers(response: Response) -> Response:
        for name, value in HEADERS.items():
            response.headers.setdefault(name, value)
        return set_cookie(response)

    @app.context_processor
    def _context() -> dict[str, Any]:
        return {"title": title, "can_act": any(security.can(access, action) for action in security.ACTIONS),
                "can": lambda action: security.can(access, action), "read_only": read_only,
                "csrf_token": lambda: csrf_token(access)}

    @app.errorhandler(HTTPException)
    def _http_error(error: HTTPException) -> tuple[str, int]:
        message = redact(error.description or "")
        return render_template("error.html", code=error.code, message=message), error.code or 500

    @app.errorhandler(DependencyUnavailable)
    @app.errorhandler(NotConfigured)  # make_app() without a suite, in a process that has not called setup() (yet)
    @app.errorhandler(redis_lib.RedisError)
    def _unavailable(error: Exception) -> tuple[str, int]:
        if isinstance(error, NotConfigured):
            message = f"{error}: the dashboard has no suite to show"
        else:
            message = redact(str(error))
            message = message if isinstance(error, DependencyUnavailable) else f"Redis could not be reached: {message}"
            logger.warning("Dashboard: %s", message)
        return render_template("error.html", code=503, message=message), 503

    for rule, endpoint, view, method, _ in (*pages.ROUTES, *actions.ROUTES):
        app.add_url_rule(rule, endpoint, view, methods=[method])
    return app


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
    with contextlib.closing(server), contextlib.suppress(KeyboardInterrupt):
        server.run()
