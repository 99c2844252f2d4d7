"""Settings of the example project. The database is the outbox's: OUTBOX_DATABASE_URL (or, on a developer's
machine with it unset, the project's embedded PostgreSQL, as the outbox's CLI and relay use), on Django's
PostgreSQL backend, which runs on psycopg 3 when it is installed (what ``outbox.enqueue`` needs)."""

import os

from psycopg.conninfo import conninfo_to_dict

import outbox_pipelines

DEBUG = os.environ.get("DJANGO_DEBUG") == "1"
# Development only: a deployment sets DJANGO_SECRET_KEY (the project signs nothing, but Django requires one).
SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "django-insecure-example-only")
ALLOWED_HOSTS = os.environ.get("DJANGO_ALLOWED_HOSTS", "127.0.0.1,localhost").split(",")

INSTALLED_APPS = ["django_service.orders"]
MIDDLEWARE: list[str] = []
ROOT_URLCONF = "django_service.urls"
USE_TZ = True


def database(url: str) -> dict[str, object]:
    """Django's DATABASES entry for a libpq URL (postgresql:// or SQLAlchemy's postgresql+psycopg://)."""
    _, _, rest = url.partition("://")
    info = conninfo_to_dict(f"postgresql://{rest}")
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": info.pop("dbname", ""),
        "USER": info.pop("user", ""),
        "PASSWORD": info.pop("password", ""),
        "HOST": info.pop("host", ""),
        "PORT": info.pop("port", ""),
        "OPTIONS": info,  # the rest of the URL's parameters (sslmode, ...), as psycopg takes them
    }


DATABASES = {"default": database(outbox_pipelines.database_url())}
