"""A shop whose orders send their invoices through Dramatiq: django_dramatiq's broker settings, and
dramatiq_unique.contrib.django after it.  PostgreSQL and Redis from the environment."""

import os
from urllib.parse import urlparse

DATABASE = urlparse(os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/test"))
REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
SCHEMA = os.environ.get("EXAMPLE_SCHEMA", "public")  # run.py gives each run its own

SECRET_KEY = "example-only"
DEBUG = True
ALLOWED_HOSTS = ["*"]
USE_TZ = True
ROOT_URLCONF = "shop.urls"
DEFAULT_AUTO_FIELD = "django.db.models.AutoField"
INSTALLED_APPS = [
    "django.contrib.admin", "django.contrib.auth", "django.contrib.contenttypes", "django.contrib.sessions",
    "django.contrib.messages",
    "django_dramatiq",
    "dramatiq_unique.contrib.django",  # after django_dramatiq, which makes the broker
    "orders",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
TEMPLATES = [{"BACKEND": "django.template.backends.django.DjangoTemplates", "APP_DIRS": True, "OPTIONS": {
    "context_processors": ["django.template.context_processors.request", "django.contrib.auth.context_processors.auth",
                           "django.contrib.messages.context_processors.messages"]}}]
DATABASES = {"default": {
    "ENGINE": "django.db.backends.postgresql", "NAME": DATABASE.path.lstrip("/"), "USER": DATABASE.username,
    "HOST": DATABASE.hostname, "PORT": DATABASE.port or 5432, "OPTIONS": {"options": f"-c search_path={SCHEMA}"},
}}

# django_dramatiq's documented settings.
DRAMATIQ_BROKER = {
    "BROKER": "dramatiq.brokers.redis.RedisBroker",
    "OPTIONS": {"url": REDIS_URL, "namespace": f"shop-{SCHEMA}"},
    "MIDDLEWARE": [
        "dramatiq.middleware.AgeLimit",
        "dramatiq.middleware.TimeLimit",
        "dramatiq.middleware.Callbacks",
        "dramatiq.middleware.Retries",
        "django_dramatiq.middleware.DbConnectionsMiddleware",
        "django_dramatiq.middleware.AdminMiddleware",
    ],
}
# The suite: the job tables' database, its Redis (default: the broker's), its settings.
DRAMATIQ_UNIQUE = {"DATABASE": "default", "SETTINGS": {"key_prefix": f"shop-{SCHEMA}", "redrive_interval": 1000}}
