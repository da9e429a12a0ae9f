"""Fixtures of the dashboard's tests: the app on the test's suite, and a client that acts as a browser.

``Dash`` reads the CSRF token out of a page the way a browser's form carries it,
so an action's test goes through the same checks a person's click does.
"""

from __future__ import annotations

import re
import threading
from typing import Any, Iterator, Optional

import pytest
from flask.testing import FlaskClient

from dramatiq_unique.web import make_app

TOKEN = re.compile(r'name="csrf_token" value="([0-9a-f]{64})"')


class Dash:
    """A test client of the dashboard that finds its CSRF token in the pages it reads."""

    def __init__(self, client: FlaskClient, prefix: str = "") -> None:
        self.client, self.prefix = client, prefix
        self._token: Optional[str] = None

    def get(self, path: str, **kwargs: Any) -> Any:
        return self.client.get(self.prefix + path, **kwargs)

    def page(self, path: str, status: int = 200, **kwargs: Any) -> str:
        response = self.get(path, **kwargs)
        assert response.status_code == status, response.get_data(as_text=True)[:2000]
        return response.get_data(as_text=True)

    def token(self, path: str = "/dead") -> str:
        """The token of this browser's cookie, read from the first page with a form (then kept:
        it lasts as long as the cookie)."""
        if self._token is None:
            match = TOKEN.search(self.page(path))
            assert match, f"no form on {path}"
            self._token = match.group(1)
        return self._token

    def post(self, path: str, data: Optional[dict] = None, token: Optional[str] = None, **kwargs: Any) -> Any:
        form = dict(data or {})
        form.setdefault("csrf_token", token if token is not None else self.token())
        return self.client.post(self.prefix + path, data=form, **kwargs)


@pytest.fixture
def database_url(request: pytest.FixtureRequest) -> str:
    """SQLite unless a test asks for PostgreSQL too (``parametrize("database_url", [...],
    indirect=True)``): the pages' queries are the ops layer's, tested there on both databases;
    the every-page test runs here on both."""
    kind = getattr(request, "param", "sqlite")
    return request.getfixturevalue("pg_url" if kind == "postgres" else "sqlite_url")


@pytest.fixture
def dash(suite) -> Iterator[Dash]:
    yield Dash(make_app(suite).test_client())


@pytest.fixture
def served() -> Iterator[Any]:
    """Starts a standalone server (make_server's arguments) in a thread; stops it after the test."""
    from dramatiq_unique.web import make_server

    running: list[tuple[Any, threading.Thread]] = []

    def start(*args: Any, **kwargs: Any) -> Any:
        server = make_server(*args, port=0, **kwargs)
        thread = threading.Thread(target=server.run, daemon=True, name="dashboard")
        thread.start()
        running.append((server, thread))
        return server

    yield start
    for server, thread in running:
        server.close()
        thread.join(timeout=5)
