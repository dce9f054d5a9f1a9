"""Settings of the example project: one database, from DATABASE_URL, on Django's
PostgreSQL backend, which uses psycopg 3 when it is installed (brooq depends on it)."""

from __future__ import annotations

import os

from psycopg.conninfo import conninfo_to_dict

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "example-only-not-secret")
DEBUG = False
ALLOWED_HOSTS = ["*"]
ROOT_URLCONF = "mysite.urls"
INSTALLED_APPS = ["shop"]
MIDDLEWARE: list[str] = []
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"


def database(url: str) -> dict[str, object]:
    """Django's DATABASES entry for a DSN (a postgresql:// URL or key=value pairs): the
    PostgreSQL backend on psycopg 3; parameters Django has no setting for go to OPTIONS."""
    params = conninfo_to_dict(url)
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": params.pop("dbname", ""),
        "USER": params.pop("user", ""),
        "PASSWORD": params.pop("password", ""),
        "HOST": params.pop("host", ""),
        "PORT": str(params.pop("port", "")),
        "OPTIONS": params,
    }


DATABASES = {"default": database(os.environ["DATABASE_URL"])}
