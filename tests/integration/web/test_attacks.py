"""What an attacker tries: markup in what the pages reflect, a hook that fails, forged outcomes."""

from __future__ import annotations

import dramatiq

from dramatiq_unique.web import make_app
from tests.helpers import job_of
from tests.integration.web.conftest import Dash

XSS = '"><script>alert(1)</script>'


def test_nothing_a_request_sends_comes_back_as_markup(suite, dash):
    @dramatiq.actor(track=True)
    def noted(n):
        pass

    noted.send(1)
    for path in (f"/jobs?key={XSS}", f"/jobs?actor={XSS}", f"/jobs/{XSS}", f"/dead?actor={XSS}",
                 f"/jobs?status={XSS}", f"/?done={XSS}", "/jobs?key=%3Cb%3E=1"):
        html = dash.get(path).get_data(as_text=True)
        assert "<script>alert(1)" not in html and "<b>" not in html, path
    assert "The job was sent again." not in dash.page("/?done=anything") + "x"  # only known words
    response = dash.get("/")
    assert "script-src" not in response.headers["Content-Security-Policy"]  # default-src 'none': no script at all
    assert response.headers["X-Content-Type-Options"] == "nosniff"


def test_a_hook_that_raises_or_answers_other_than_true_lets_nothing_through(suite, broker):
    @dramatiq.actor(track=True)
    def later(n):
        pass

    message = later.send_with_options(args=(1,), delay=60_000)

    def broken(request, action):
        raise RuntimeError("the host's session store is down")

    dash = Dash(make_app(suite, auth=broken).test_client())
    assert dash.get("/").status_code == 403
    assert Dash(make_app(suite, auth=lambda request, action: "no").test_client()).get("/").status_code == 403
    assert dash.client.post(f"/jobs/{job_of(message).id}/cancel", data={"csrf_token": "x"}).status_code == 403
    assert job_of(message).status == "queued"
