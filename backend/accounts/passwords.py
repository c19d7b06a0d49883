"""Salted password hashes (stdlib scrypt): `scrypt$n$r$p$salt$hash`, never the password itself."""

from __future__ import annotations

import base64
import functools
import hashlib
import hmac
import secrets

from backend.errors import UsersFileError

SCHEME = "scrypt"
# 16 MiB of memory and ~50 ms per check: slow for guessing, quick for one login.
N, R, P = 2**14, 8, 1
KEY_BYTES = 32
SALT_BYTES = 16
MIN_LENGTH = 8


class PasswordHashError(UsersFileError, ValueError):
    """A stored hash is not in the `scrypt$n$r$p$salt$hash` format (in the users file or ERNIE_AUTH__USERS)."""


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _derive(password: str, salt: bytes, n: int, r: int, p: int, length: int) -> bytes:
    return hashlib.scrypt(password.encode("utf-8"), salt=salt, n=n, r=r, p=p, dklen=length, maxmem=256 * 1024 * 1024)


def hash_password(password: str) -> str:
    """Return a new salted hash of `password` (a different one every call)."""
    salt = secrets.token_bytes(SALT_BYTES)
    key = _derive(password, salt, N, R, P, KEY_BYTES)
    return f"{SCHEME}${N}${R}${P}${_b64(salt)}${_b64(key)}"


def parse_hash(stored: str) -> tuple[int, int, int, bytes, bytes]:
    """Split a stored hash into (n, r, p, salt, key); raise PasswordHashError when it is malformed."""
    parts = stored.split("$")
    if len(parts) != 6 or parts[0] != SCHEME:
        raise PasswordHashError.of("password.not_a_hash")
    try:
        n, r, p = (int(x) for x in parts[1:4])
        salt = base64.b64decode(parts[4], validate=True)
        key = base64.b64decode(parts[5], validate=True)
    except ValueError as exc:
        raise PasswordHashError.of("password.damaged") from exc
    if n < 2 or n & (n - 1) or not (1 <= r <= 64 and 1 <= p <= 16) or len(salt) < 8 or len(key) < 16:
        raise PasswordHashError.of("password.out_of_range")
    return n, r, p, salt, key


def verify_password(password: str, stored: str) -> bool:
    """True when `password` matches the stored hash (constant-time comparison)."""
    n, r, p, salt, key = parse_hash(stored)
    return hmac.compare_digest(_derive(password, salt, n, r, p, len(key)), key)


@functools.cache
def dummy_hash() -> str:
    """A hash to check against when the user name is unknown, so a wrong name takes as long as a wrong password."""
    return hash_password(secrets.token_hex(16))
