"""The chat's quota place (Gateway.turn): none without a user, over a quota the QuotaError, and a failing database
does not stop the chat."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from backend.api.quotas import Lease
from backend.api.router import Gateway
from backend.errors import QuotaError, StorageError


class FakeQuotas:
    def __init__(self, refusal: Exception | None = None) -> None:
        self.refusal, self.released = refusal, []  # type: ignore[var-annotated]

    async def admit(self, user: str, route: str) -> Lease:
        if self.refusal is not None:
            raise self.refusal
        return Lease("1", user, route)  # type: ignore[arg-type]

    async def release_soon(self, lease: Lease) -> None:
        self.released.append(lease)


def gateway(quotas: FakeQuotas | None) -> Gateway:
    return Gateway(SimpleNamespace(), SimpleNamespace(), None, quotas)  # type: ignore[arg-type]


async def test_a_turn_holds_a_place_and_gives_it_back() -> None:
    quotas = FakeQuotas()
    async with gateway(quotas).turn("alice") as lease:
        assert lease is not None and lease.user == "alice" and not quotas.released
    assert quotas.released == [lease]
    async with gateway(quotas).turn(None) as nobody:  # no login: no user, no quota
        assert nobody is None


async def test_over_a_quota_the_turn_is_refused_and_a_broken_database_lets_it_go_on() -> None:
    with pytest.raises(QuotaError):
        async with gateway(FakeQuotas(QuotaError.of("quota.rate", limit=1, retry_s=3))).turn("alice"):
            pytest.fail("the turn ran")
    broken = FakeQuotas(StorageError.of("storage.locked", where="x", doing="saving", reason="locked"))
    async with gateway(broken).turn("alice") as lease:
        assert lease is None
