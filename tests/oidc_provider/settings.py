"""Django settings of the tests' OpenID provider; `__main__` sets the TEST_OIDC_* variables before Django reads them.

TEST_OIDC_DATA: the data folder (database, keys); TEST_OIDC_ISSUER: the issuer URL (discovery's `issuer`, the ID
tokens' `iss`; the endpoints' URLs are made of its scheme and host); TEST_OIDC_ID_TOKEN_S: the ID tokens' lifetime."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

DATA = Path(os.environ["TEST_OIDC_DATA"]).resolve()
ISSUER = os.environ.get("TEST_OIDC_ISSUER", "")
ID_TOKEN_S = int(os.environ.get("TEST_OIDC_ID_TOKEN_S", "300"))
DATA.mkdir(parents=True, exist_ok=True)


def _kept(name: str, make: bytes) -> str:
    """The content of DATA/name, written from `make` if it is not there yet (first writer wins, mode 600)."""
    path = DATA / name
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return path.read_text()
    with os.fdopen(fd, "wb") as out:
        out.write(make)
    return make.decode()


def _new_rsa_key() -> bytes:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


SECRET_KEY = _kept("django-secret-key", secrets.token_urlsafe(50).encode())
RSA_KEY = _kept("oidc-rsa-key.pem", _new_rsa_key()) if ISSUER else ""  # only `serve` signs

DEBUG = False
ALLOWED_HOSTS = ["localhost", "127.0.0.1", "[::1]"]
ROOT_URLCONF = "tests.oidc_provider.urls"
WSGI_APPLICATION = None
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

INSTALLED_APPS = [
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "oauth2_provider",
    "tests.oidc_provider",  # its templates/
]
MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {"context_processors": ["django.template.context_processors.request"]},
    }
]
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": DATA / "provider.sqlite3",
        # the admin commands write while the server runs
        "OPTIONS": {"timeout": 20, "transaction_mode": "IMMEDIATE", "init_command": "PRAGMA journal_mode=WAL;"},
    }
}
# Throwaway accounts: PBKDF2 with few rounds, so that a sign-in (and every client-secret check) is quick on 2 cores.
PASSWORD_HASHERS = ["tests.oidc_provider.validator.QuickPBKDF2PasswordHasher"]

# The provider's own cookies: never the same names as the app's (both may live on one host name in a browser).
SESSION_COOKIE_NAME = "provider_session"
CSRF_COOKIE_NAME = "provider_csrf"
LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/"

OAUTH2_PROVIDER = {
    "OIDC_ENABLED": True,
    "OIDC_RSA_PRIVATE_KEY": RSA_KEY,
    "OIDC_ISS_ENDPOINT": ISSUER,
    "OIDC_RP_INITIATED_LOGOUT_ENABLED": True,
    "OIDC_RP_INITIATED_LOGOUT_ALWAYS_PROMPT": False,
    "OIDC_RESPONSE_TYPES_SUPPORTED": ["code"],  # its one client uses the authorization-code grant
    "PKCE_REQUIRED": True,
    "COMPLIANT_BCP_RFC9700_PKCE_METHOD": True,  # S256 only, no "plain"
    "ID_TOKEN_EXPIRE_SECONDS": ID_TOKEN_S,
    "OAUTH2_VALIDATOR_CLASS": "tests.oidc_provider.validator.ClaimsValidator",
    "SCOPES": {
        "openid": "OpenID Connect",
        "profile": "Your name and user name",
        "email": "Your e-mail address",
        "groups": "Your groups (they come with openid anyway)",
    },
    "DEFAULT_SCOPES": ["openid"],
}

# Quiet: waitress and Django say only what went wrong (a 4xx as one line, a 5xx with its traceback), on stderr.
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"stderr": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["stderr"], "level": "WARNING"},
    "loggers": {"django": {"handlers": ["stderr"], "level": "WARNING", "propagate": False}},
}
