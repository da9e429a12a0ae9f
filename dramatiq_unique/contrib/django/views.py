"""The dashboard (a WSGI app, dramatiq_unique.web) as a Django view, behind Django's login."""

from __future__ import annotations

import functools
import io
from typing import Any, Callable

from django.conf import settings
from django.contrib.admin.views.decorators import staff_member_required
from django.http import HttpRequest, HttpResponse
from django.views.decorators.csrf import csrf_exempt


@functools.cache
def _dashboard() -> Callable[..., Any]:
    from dramatiq_unique.contrib.django.apps import options
    from dramatiq_unique.web import make_app

    # Signed with SECRET_KEY, so every process behind one address accepts the others' forms.
    return make_app(secret_key=settings.SECRET_KEY, **options().get("DASHBOARD", {}))


def call_wsgi(app: Callable[..., Any], request: HttpRequest, path: str) -> HttpResponse:
    """``app``'s answer to ``request``, mounted where the URL's ``path`` begins."""
    environ = dict(request.META)  # Django's WSGI environ (its test client makes one too)
    body = request.body
    environ.update({"SCRIPT_NAME": request.path[:len(request.path) - len(path)].rstrip("/"),
                    "PATH_INFO": "/" + path, "wsgi.input": io.BytesIO(body), "CONTENT_LENGTH": str(len(body))})
    started: dict[str, Any] = {}

    def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> None:
        started.update(status=int(status.split()[0]), headers=headers)

    chunks = app(environ, start_response)
    try:
        content = b"".join(chunks)
    finally:
        getattr(chunks, "close", lambda: None)()
    response = HttpResponse(content, status=started["status"])
    for name, value in started["headers"]:
        if name.lower() == "set-cookie":
            response.cookies.load(value)
        else:
            response[name] = value
    return response


@staff_member_required
@csrf_exempt  # the dashboard's forms carry its own CSRF token and it checks their origin
def dashboard(request: HttpRequest, path: str = "") -> HttpResponse:
    """The dashboard, for staff users (others are sent to the admin's login)."""
    return call_wsgi(_dashboard(), request, path)
