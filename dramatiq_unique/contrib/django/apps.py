"""The Django app: sets the suite up from Django's settings when the app registry is populated, before
any ``models.py`` is imported (as ``django_dramatiq`` sets its broker up), so that actors declared at
import find the suite's middlewares.  Nothing connects to the database then."""

from __future__ import annotations

from typing import Any, Optional

import dramatiq
from django.apps import AppConfig
from django.conf import settings

from dramatiq_unique.errors import InvalidOption

#: Django's setting: a dict of DATABASE (the alias of the job tables, "default"), REDIS (a URL or a
#: list of them; default: the Redis broker's own client), SETTINGS (the suite's settings) and
#: DASHBOARD (keywords of ``dramatiq_unique.web.make_app``: read_only, title, page_size).
SETTING = "DRAMATIQ_UNIQUE"


def options() -> dict[str, Any]:
    given = getattr(settings, SETTING, {})
    unknown = set(given) - {"DATABASE", "REDIS", "SETTINGS", "DASHBOARD"}
    if unknown:
        raise InvalidOption(f"unknown keys in {SETTING}: {', '.join(sorted(unknown))}")
    return given


def setup(broker: Optional[dramatiq.Broker] = None, **overrides: Any) -> Any:
    """Set the suite up on ``broker`` (default: Dramatiq's global one, which ``django_dramatiq`` makes
    from ``DRAMATIQ_BROKER``) from the ``DRAMATIQ_UNIQUE`` setting, its suite settings updated with
    ``overrides``; returns the suite."""
    from dramatiq_unique import setup as suite_setup
    from dramatiq_unique.contrib.django.database import DjangoDatabase

    given = options()
    broker = broker or dramatiq.get_broker()
    redis = given.get("REDIS") or getattr(broker, "client", None)
    if redis is None:
        raise InvalidOption(f"{SETTING}['REDIS'] is required with a broker that has no Redis client")
    # No Redis check by default: manage.py's commands (migrate, collectstatic) run without it.
    suite_settings = {"check_redis": False, **given.get("SETTINGS", {}), **overrides}
    global _suite
    _suite = suite_setup(broker, database=DjangoDatabase(given.get("DATABASE", "default")), redis=redis,
                         **suite_settings)
    return _suite


_suite: Any = None


def project_suite() -> Any:
    """The suite :func:`setup` made last (the app's), whatever other suites the process set up since."""
    if _suite is None:
        raise InvalidOption("dramatiq_unique.contrib.django is not in INSTALLED_APPS")
    return _suite


def migrate_tables(apps: Any, schema_editor: Any) -> None:
    """The migrations' step: the suite's own ``migrate`` on every job table its actors declare."""
    from django.utils.module_loading import autodiscover_modules

    from dramatiq_unique.health import commands, target

    suite = project_suite()
    if schema_editor.connection.alias != suite.db.alias:
        return
    autodiscover_modules("tasks")  # the actors, as rundramatiq finds them: their job_model tables too
    for model in suite.models:  # bound to the suite set up last, which may be another (tests)
        model.bind(suite.db, bind_refs=False, bind_backrefs=False)
    results: list[Any] = []
    if commands.migrate(target.of_suite(suite), lambda data, text: results.append(text())):
        raise RuntimeError(f"the job tables could not be migrated:\n{results[0]}")


class DramatiqUniqueConfig(AppConfig):
    name = "dramatiq_unique.contrib.django"
    label = "dramatiq_unique"
    verbose_name = "Dramatiq jobs"
    default_auto_field = "django.db.models.AutoField"

    def __init__(self, app_name: str, app_module: Any) -> None:
        super().__init__(app_name, app_module)
        self.suite = setup()
