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
    from werkzeug.test import run_wsgi_app  # Flask's, which the dashboard needs

    environ = dict(request.META)  # Django's WSGI environ (its test client makes one too)
    body = request.body
    environ.update({"SCRIPT_NAME": request.path[:len(request.path) - len(path)].rstrip("/"),
                    "PATH_INFO": "/" + path, "wsgi.input": io.BytesIO(body), "CONTENT_LENGTH": str(len(body))})
    chunks, status, headers = run_wsgi_app(app, environ, buffered=True)
    response = HttpResponse(b"".join(chunks), status=int(status.split()[0]))
    for name, value in headers:
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
