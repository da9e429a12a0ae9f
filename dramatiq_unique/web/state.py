"""What a request works on: the suite the dashboard shows, and its settings."""

from __future__ import annotations

from typing import TYPE_CHECKING

from flask import current_app, g

from dramatiq_unique import suite as _config
from dramatiq_unique.errors import JobStateError

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


def acting_suite() -> "Suite":
    """The suite an action changes.  ``retry_job``, ``cancel_job`` and ``set_concurrency_limit``
    act on the process's current suite (the last ``setup()``), so an app made for another one must
    not act through them: it would change the wrong app's jobs."""
    suite = current_suite()
    if suite is not _config.current():
        raise JobStateError("the dashboard's suite is not this process's current one (the last setup()): "
                            "actions would reach another app")
    return suite


def page_size() -> int:
    return int(current_app.config["DU_PAGE_SIZE"])
