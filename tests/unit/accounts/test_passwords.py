"""Password hashes: salted, verifiable, and malformed hashes refused with a reason."""

from __future__ import annotations

import pytest

from backend.accounts.passwords import PasswordHashError, hash_password, parse_hash, verify_password


def test_hash_is_salted_and_verifies() -> None:
    first, second = hash_password("correct horse"), hash_password("correct horse")
    assert first != second, "every hash has its own salt"
    assert "correct horse" not in first
    assert first.startswith("scrypt$16384$8$1$")
    assert verify_password("correct horse", first) and verify_password("correct horse", second)
    assert not verify_password("correct horsE", first)
    assert not verify_password("", first)


def test_unicode_passwords() -> None:
    stored = hash_password("密码-пароль-🔑")
    assert verify_password("密码-пароль-🔑", stored)
    assert not verify_password("密码-пароль", stored)


@pytest.mark.parametrize(
    "stored",
    [
        "plain-text-password",
        "pbkdf2$1$2$3$abcd$efgh",
        "scrypt$16384$8$1$!!notbase64!!$AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=",
        "scrypt$1000$8$1$AAAAAAAAAAAAAAAAAAAAAA==$AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=",  # n not a power of 2
        "scrypt$16384$8$1$AAAA$AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=",  # salt too short
        "scrypt$x$8$1$AAAAAAAAAAAAAAAAAAAAAA==$AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=",
    ],
)
def test_malformed_hashes_are_refused(stored: str) -> None:
    with pytest.raises(PasswordHashError) as err:
        parse_hash(stored)
    assert "add-user" in err.value.hint
    with pytest.raises(PasswordHashError):
        verify_password("anything", stored)
    with pytest.raises(ValueError):  # callers that caught ValueError still do
        parse_hash(stored)
