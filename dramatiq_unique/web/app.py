"""The dashboard's Flask app (:func:`make_app`): a WSGI callable that mounts under any path of a WSGI
host, or of an ASGI one through an adapter (links are built with ``url_for``, which honours
``SCRIPT_NAME``)."""

from __future__ import annotations

import logging
import secrets
from typing import TYPE_CHECKING, Any, Optional, Union

import redis as redis_lib
from flask import Flask, Response, render_template, request
from werkzeug.exceptions import HTTPException

from dramatiq_unique.errors import DependencyUnavailable, InvalidOption, NotConfigured
from dramatiq_unique.logs import RedactPasswords
from dramatiq_unique.redaction import redact
from dramatiq_unique.web import actions, pages, present, security
from dramatiq_unique.web.security import Access, AuthHook, BasicAuth, check_access, csrf_token, set_cookie

if TYPE_CHECKING:
    from dramatiq_unique.suite import Suite

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

    app = Flask(__name__, template_folder="templates", static_folder="static", static_url_path="/static")
    app.config.update(DU_ACCESS=access, DU_SUITE=suite, DU_TITLE=title, DU_PAGE_SIZE=page_size,
                      MAX_CONTENT_LENGTH=64 * 1024)  # our forms are tiny: a huge POST is refused early
    app.jinja_env.autoescape = True  # every template, whatever its name: job arguments are user data
    app.jinja_env.filters.update(present.FILTERS)

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

