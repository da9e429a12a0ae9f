"""The web dashboard (the ``web`` extra): :func:`make_app` to mount in a host app, :func:`serve` to run it
alone.  Only the command line's ``web`` command imports it, lazily: the rest of the suite never needs Flask."""

from __future__ import annotations

try:
    import flask  # noqa: F401
    import waitress  # type: ignore[import-untyped]  # noqa: F401
except ImportError as e:  # pragma: no cover - the extra is missing
    raise ImportError("the dashboard needs the web extra: pip install 'dramatiq_unique[web]'") from e

from dramatiq_unique.web.app import make_app, make_server, serve

__all__ = ["make_app", "make_server", "serve"]
