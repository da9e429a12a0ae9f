"""A Django project for the tests: settings as django_dramatiq documents them, the job tables and
Django's own in a PostgreSQL schema of this process's, made by ``migrate``."""

from __future__ import annotations

import atexit
import uuid
from typing import Any, Iterator
from urllib.parse import urlparse

import django
import dramatiq
import peewee as pw
import pytest
from django.conf import settings
from dramatiq.brokers.redis import RedisBroker

from tests.conftest import PG_URL, REDIS_URL

SCHEMA = f"dj_{uuid.uuid4().hex[:10]}"
_pg = urlparse(PG_URL)

#: django_dramatiq's documented middleware (Prometheus left out: it serves a port per worker).
DRAMATIQ_MIDDLEWARE = [
    "dramatiq.middleware.AgeLimit",
    "dramatiq.middleware.TimeLimit",
    "dramatiq.middleware.Callbacks",
    "dramatiq.middleware.Retries",
    "django_dramatiq.middleware.DbConnectionsMiddleware",
    "django_dramatiq.middleware.AdminMiddleware",
]


def _admin() -> pw.PostgresqlDatabase:
    return pw.PostgresqlDatabase(_pg.path.lstrip("/"), host=_pg.hostname, port=_pg.port or 5432, user=_pg.username)


def _drop_schema() -> None:
    _admin().execute_sql(f'DROP SCHEMA IF EXISTS "{SCHEMA}" CASCADE')


if not settings.configured:
    _admin().execute_sql(f'CREATE SCHEMA "{SCHEMA}"')
    # Made when this module is imported, which a test worker that runs no Django test does too: dropped
    # when the process ends, whatever ran.
    atexit.register(_drop_schema)
    settings.configure(
        SECRET_KEY="tests", DEBUG=False, USE_TZ=True, ROOT_URLCONF="tests.integration.contrib.django.urls",
        ALLOWED_HOSTS=["*"],
        DATABASES={"default": {
            "ENGINE": "django.db.backends.postgresql", "NAME": _pg.path.lstrip("/"), "USER": _pg.username,
            "HOST": _pg.hostname, "PORT": _pg.port or 5432, "CONN_MAX_AGE": None,
            "OPTIONS": {"options": f"-c search_path={SCHEMA}"},
        }},
        INSTALLED_APPS=[
            "django.contrib.admin", "django.contrib.auth", "django.contrib.contenttypes",
            "django.contrib.sessions", "django.contrib.messages",
            "django_dramatiq", "dramatiq_unique.contrib.django",
        ],
        MIDDLEWARE=[
            "django.contrib.sessions.middleware.SessionMiddleware",
            "django.middleware.csrf.CsrfViewMiddleware",
            "django.contrib.auth.middleware.AuthenticationMiddleware",
            "django.contrib.messages.middleware.MessageMiddleware",
        ],
        TEMPLATES=[{"BACKEND": "django.template.backends.django.DjangoTemplates", "APP_DIRS": True, "OPTIONS": {
            "context_processors": ["django.contrib.auth.context_processors.auth",
                                   "django.contrib.messages.context_processors.messages",
                                   "django.template.context_processors.request"]}}],
        DRAMATIQ_BROKER={"BROKER": "dramatiq.brokers.redis.RedisBroker", "OPTIONS": {"url": REDIS_URL},
                         "MIDDLEWARE": DRAMATIQ_MIDDLEWARE},
        DRAMATIQ_UNIQUE={"DATABASE": "default", "REDIS": REDIS_URL, "SETTINGS": {"redriver": False}},
    )
    django.setup()


@pytest.fixture(scope="session")
def migrated() -> Iterator[None]:
    from django.core.management import call_command
    from django.db import connections

    call_command("migrate", verbosity=0)
    yield
    connections.close_all()


@pytest.fixture
def dj_broker(key_prefix: str) -> Iterator[RedisBroker]:
    """A broker with django_dramatiq's middleware, as its app makes one, in this test's namespace."""
    from django_dramatiq.utils import load_middleware

    broker = RedisBroker(url=REDIS_URL, namespace=f"{key_prefix}-broker",
                         middleware=[load_middleware(path) for path in DRAMATIQ_MIDDLEWARE])
    dramatiq.set_broker(broker)
    yield broker
    broker.flush_all()
    broker.close()


@pytest.fixture
def dj_suite(migrated: None, dj_broker: RedisBroker, key_prefix: str) -> Iterator[Any]:
    """The suite as the app sets it up from DRAMATIQ_UNIQUE, on this test's broker and key prefix."""
    from django.db import connections

    from dramatiq_unique.contrib.django.apps import setup

    suite = setup(dj_broker, key_prefix=key_prefix)
    yield suite
    connections.close_all()
