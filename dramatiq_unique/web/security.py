"""Who may see and who may act: basic auth, the host app's hook, read-only, CSRF tokens and ``Origin``.
Every request passes :func:`check_access` (a ``before_request``) before its view, so nothing is
reachable around it.  Only ``True`` from a hook or check grants; one that raises refuses (fails closed)."""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
from dataclasses import dataclass
from typing import Callable, Optional, Union
from urllib.parse import urlsplit

from flask import Response, abort, g, request

logger = logging.getLogger(__name__)

#: The hook a host app gives: ``auth(request, action) -> bool`` (action None: may it see).
AuthHook = Callable[..., bool]
#: ``(user, password)``, or a callable given both that answers whether they are right.
BasicAuth = Union[tuple[str, str], Callable[[str, str], bool]]

CSRF_COOKIE = "du_csrf"
CSRF_FIELD = "csrf_token"
#: The actions a POST may name (what the hook is asked about).
ACTIONS = ("retry", "cancel", "limit", "halt", "retry_all", "cancel_all")


@dataclass
class Access:
    """The access settings of one dashboard app."""

    read_only: bool
    auth: Optional[AuthHook]
    basic_auth: Optional[BasicAuth]
    #: Signs CSRF tokens; random per app unless given (give one when several processes serve the dashboard).
    secret: bytes


def _basic_ok(setting: BasicAuth) -> bool:
    sent = request.authorization  # None for a header Werkzeug cannot read
    if sent is None or sent.type != "basic":
        return False
    user, password = sent.username or "", sent.password or ""
    if callable(setting):
        return _granted("basic_auth check", setting, user, password)
    # Both compared (a list, not a short-circuit), so the time does not tell which one was wrong.
    return all([hmac.compare_digest(user.encode(), setting[0].encode()),
                hmac.compare_digest(password.encode(), setting[1].encode())])


def _granted(what: str, check: Callable[..., object], *args: object) -> bool:
    """Only ``True`` grants: a truthy object (a user row that may be inactive, "no") is no grant, and
    a check that raises lets nothing in (fails closed) and says why in the log."""
    try:
        return check(*args) is True
    except Exception:
        logger.exception("The dashboard's %s raised: request refused", what)
        return False


def may(access: Access, action: Optional[str]) -> bool:
    """Whether the host's hook lets this request see (``action=None``) or do ``action``."""
    if access.auth is None:
        return True
    # Asked once per action and request: a page asks about every action to show its buttons, and a
    # host's hook may cost a query (a session, a user).
    answers: dict[Optional[str], bool] = g.setdefault("du_may", {})
    if action not in answers:
        answers[action] = _granted("auth hook", access.auth, request._get_current_object(), action)  # type: ignore[attr-defined]
    return answers[action]


def can(access: Access, action: str) -> bool:
    """Whether the pages should offer ``action`` to this request (its button)."""
    return not access.read_only and may(access, action)


def check_access(access: Access, action_of: Union[str, Callable[[], str], None]) -> Optional[Response]:
    """None if the request may go on; else the refusal (401, 403).  ``action_of``: for an endpoint that
    changes state, the action this request does, or what tells it (from its form), asked once the CSRF
    token is checked; None for a page."""
    if access.basic_auth is not None and not _basic_ok(access.basic_auth):
        return Response("authentication required\n", 401, mimetype="text/plain",
                        headers={"WWW-Authenticate": 'Basic realm="dramatiq_unique", charset="UTF-8"'})
    if request.method not in ("GET", "HEAD"):
        if access.read_only:
            abort(403, "the dashboard is read-only")
        if action_of is None:
            abort(404)
        check_origin()
        check_csrf(access)
        action = action_of() if callable(action_of) else action_of
        if action not in ACTIONS:
            abort(404)
        if not may(access, action):
            abort(403, f"not allowed to {action}")
    elif not may(access, None):
        abort(403, "not allowed to see the dashboard")
    return None


def check_origin() -> None:
    """Refuse a POST sent from a page of another host (browsers send Origin on every POST); behind a
    proxy that rewrites ``Host``, ``X-Forwarded-Host`` names ours (a form of another site cannot set it)."""
    origin = request.headers.get("Origin")
    if not origin:  # an old browser, or a client that is not one: the CSRF token still decides
        return
    # "null" too is refused: a sandboxed frame of another site sends it.
    ours = {request.host, *(h.strip() for h in request.headers.get("X-Forwarded-Host", "").split(",") if h.strip())}
    if urlsplit(origin).netloc not in ours:
        abort(403, "cross-site request refused")


def csrf_token(access: Access, cookie: str = "") -> str:
    """The form token of this browser (or of ``cookie``): HMAC of its CSRF cookie under the app's secret;
    the cookie is made (and set on the response, see :func:`set_cookie`) if missing."""
    if not cookie:
        cookie = request.cookies.get(CSRF_COOKIE, "")
        if len(cookie) != 43:  # token_urlsafe(32)
            cookie = g.get("new_csrf_cookie") or secrets.token_urlsafe(32)
            g.new_csrf_cookie = cookie
    return hmac.new(access.secret, cookie.encode(), hashlib.sha256).hexdigest()


def check_csrf(access: Access) -> None:
    cookie = request.cookies.get(CSRF_COOKIE, "")
    sent = request.form.get(CSRF_FIELD, "")
    if not cookie or not sent:
        abort(403, "missing CSRF token: reload the page and try again")
    if not hmac.compare_digest(csrf_token(access, cookie), sent):
        abort(403, "bad CSRF token: reload the page and try again")


def set_cookie(response: Response) -> Response:
    """Sets the CSRF cookie made while rendering this response, scoped to the dashboard's path."""
    value = g.get("new_csrf_cookie")
    if value:
        response.set_cookie(CSRF_COOKIE, value, path=(request.script_root or "") + "/", httponly=True,
                            samesite="Strict", secure=request.is_secure)
    return response
