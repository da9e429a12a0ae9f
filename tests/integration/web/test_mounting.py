"""The dashboard mounted in a host Flask app under a prefix, and served on its own (waitress)."""

from __future__ import annotations

import base64
import os
import re
import urllib.error
import urllib.request

import dramatiq
import pytest
from flask import Flask
from werkzeug.middleware.dispatcher import DispatcherMiddleware

import dramatiq_unique
from dramatiq_unique.web import make_app, make_server
from tests.helpers import job_of
from tests.integration.web.conftest import Dash


def test_mounted_in_a_flask_host_under_a_prefix(suite):
    @dramatiq.actor(track=True)
    def later(n):
        pass

    message = later.send_with_options(args=(1,), delay=60_000)
    host = Flask("host")

    @host.get("/")
    def home() -> str:
        return "the host's own page"

    host.wsgi_app = DispatcherMiddleware(host.wsgi_app, {"/ops/jobs": make_app(suite)})  # type: ignore[method-assign]
    client = host.test_client()
    assert client.get("/").get_data(as_text=True) == "the host's own page"
    dash = Dash(client, prefix="/ops/jobs")
    html = dash.page("/jobs")
    # Every link, the stylesheet and every form point under the prefix.
    assert 'href="/ops/jobs/static/style.css"' in html and f'href="/ops/jobs/jobs/{job_of(message).id}"' in html
    assert not re.search(r'(href|action)="/(?!ops/jobs)', html)
    with dash.get("/static/style.css") as css:  # closed: the file it streams
        assert css.status_code == 200
    response = dash.post(f"/jobs/{job_of(message).id}/cancel", {"next": "/jobs"}, token=dash.token("/jobs"))
    assert response.status_code == 303 and response.headers["Location"] == "/ops/jobs/jobs?done=cancelled"
    assert job_of(message).status == "cancelled"
    cookie = client.get_cookie("du_csrf", path="/ops/jobs/")
    assert cookie is not None and cookie.http_only  # scoped to the dashboard's path, out of scripts' reach


def test_served_standalone_with_basic_auth(suite, served):
    server = served(suite, basic_auth=("ops", "pw"))
    url = f"http://127.0.0.1:{server.port}/"
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(url, timeout=5)
    assert refused.value.code == 401
    request = urllib.request.Request(url, headers={"Authorization": "Basic " + base64.b64encode(b"ops:pw").decode()})
    with urllib.request.urlopen(request, timeout=5) as response:
        assert response.status == 200 and b"Overview" in response.read()


def test_served_from_a_process_holding_over_1024_descriptors(suite, served, tmp_path):
    # What broke the browser test at the end of the full suite: select() refused a descriptor > 1023.
    held = [open(os.devnull) for _ in range(1100)]  # noqa: SIM115
    try:
        server = served(suite)
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/jobs", timeout=5) as response:
            assert response.status == 200
    finally:
        for f in held:
            f.close()


def test_serving_beyond_loopback_needs_auth_or_read_only(suite, served, monkeypatch):
    with pytest.raises(dramatiq_unique.InvalidOption, match="basic_auth"):
        make_server(suite, host="0.0.0.0", port=0)
    monkeypatch.setenv("DRAMATIQ_UNIQUE_WEB_AUTH", "ops:pw")
    served(suite, host="0.0.0.0").close()
    monkeypatch.delenv("DRAMATIQ_UNIQUE_WEB_AUTH")
    served(suite, host="0.0.0.0", read_only=True).close()
