"""What a request works on: the suite the dashboard shows, and its settings."""

from __future__ import annotations

from typing import TYPE_CHECKING

from flask import current_app, g

from dramatiq_unique import suite as _config

if TYPE_CHECKING:
    from dramatiq_unique.suite import Suite


def current_suite() -> "Suite":
    """The suite this request shows: the app's own, else the last set-up's (looked up once a request)."""
    suite = current_app.config["DU_SUITE"]
    if suite is None:
        if "du_suite" not in g:
            g.du_suite = _config.current()
        suite = g.du_suite
    return suite


def page_size() -> int:
    return int(current_app.config["DU_PAGE_SIZE"])
