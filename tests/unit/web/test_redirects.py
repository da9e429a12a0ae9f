"""Where an action's redirect may lead: back to a page of the dashboard, never to another site."""

from __future__ import annotations

from urllib.parse import unquote, urljoin, urlsplit

import pytest

from dramatiq_unique.web import make_app
from dramatiq_unique.web.actions import _back

SITE = "http://dash.test/admin/jobs/slots"
FALLBACK = "/admin/jobs/slots"

#: What an attacker may put in ``next``: whitespace and controls that browsers drop, backslashes that they
#: read as slashes, percent-encoded forms of both, other schemes, unicode look-alikes.
LEAVING = [
    "/\t/evil.example", "/\n/evil.example", "/\r\n/evil.example", "/\r/evil.example", "\t//evil.example",
    " //evil.example", "/ /evil.example", "//evil.example", "///evil.example", "//evil.example/%2F..",
    "/\\evil.example", "/\\/evil.example", "\\\\evil.example", "\\/evil.example", "/\t\\evil.example",
    "https://evil.example", "http:evil.example", "http:/evil.example", "javascript:alert(1)",
    "JaVaScRiPt:alert(1)", " javascript:alert(1)", "\x00javascript:alert(1)", "data:text/html,<script>",
    "evil.example", "", "/%09/evil.example", "/%0a/evil.example", "/%0D%0A/evil.example", "/%2F/evil.example",
    "/%2f%2fevil.example", "/%5Cevil.example", "/%5c%5cevil.example", "/%252F%252Fevil.example",
    "/%25252F/evil.example", "/%2e%2e//evil.example", "/.//evil.example", "/..//evil.example",
    "/jobs/..//evil.example", "/\u3000/evil.example", "/\u00a0/evil.example", "/\u2028/evil.example",
    "/\u2029/evil.example", "/\ufeff/evil.example", "/\u200b/evil.example", "/\x00/evil.example",
    "/\x0b/evil.example", "/\x0c/evil.example", "/\x1b/evil.example", "/\x7f/evil.example",
    "/\x85/evil.example", "/\uff0f/evil.example", "\uff0f\uff0fevil.example", "/\uff3cevil.example",
    "/%EF%BC%8F/evil.example", "/%E3%80%80/evil.example", "/jobs\r\nSet-Cookie: du_csrf=x",
    "/jobs%0d%0aSet-Cookie:%20du_csrf=x", "/" + "a" * 5000,
]
#: The pages' own ``request.full_path`` values: kept.
OURS = ["/", "/dead?", "/jobs?status=failed&actor=deliver", "/slots?done=limit", "/jobs/17?",
        "/jobs?key=customer%3D42&done=retried", "/jobs/3f2a-9c?x=%2F%2Fnot-a-host"]


def _browser(location: str) -> tuple[str, str]:
    """(host, path) a browser goes to: it drops tabs and newlines, strips leading and trailing controls
    and spaces, and reads backslashes as slashes in an http URL (WHATWG URL)."""
    cleaned = "".join(c for c in location if c not in "\t\n\r").strip("".join(map(chr, range(0x21))))
    joined = urlsplit(urljoin(SITE, cleaned.replace("\\", "/")))
    return joined.netloc, joined.path


def _location(next_value: str) -> str:
    app = make_app()
    with app.test_request_context("/slots/limit", base_url="http://dash.test/admin/jobs", method="POST",
                                  data={"next": next_value}):
        return _back("limit", FALLBACK).headers["Location"]


@pytest.mark.parametrize("value", LEAVING, ids=[ascii(v)[:40] for v in LEAVING])
def test_next_never_leaves_the_site(value):
    location = _location(value)
    host, path = _browser(location)
    assert host == "dash.test", (value, location)
    for decoded in (path, unquote(path), unquote(unquote(path))):
        assert not decoded.startswith(("//", "/\\")) and "evil.example" not in decoded.split("/")[1:2], location
    assert location == FALLBACK + "?done=limit", (value, location)


@pytest.mark.parametrize("value", OURS)
def test_the_pages_own_paths_are_kept(value):
    location = _location(value)
    path, query = value.split("?", 1) if "?" in value else (value, "")
    kept = "&".join(p for p in query.split("&") if p and not p.startswith("done="))
    assert location == "/admin/jobs" + path + "?" + (kept + "&" if kept else "") + "done=limit"
