"""Who is calling the API: with login on, the user whose key the request carries (Authorization: Bearer KEY); without
login, nobody unless api.enabled is true, and then only the machine the app runs on (the workshop's rule:
backend.workshop.access.local_request). A page of another site, open in a browser on this machine, is not the machine:
backend.web.guard refuses every request whose Origin is not the app's own before it gets here.

The key page's own calls are made by a logged-in browser (the chat's login cookie) from the app's own page."""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import Request

from backend.accounts.login import Accounts
from backend.api.keys import KeyStore
from backend.config import AppConfig
from backend.errors import ApiError
from backend.workshop.access import Identify, local_request, no_login

LOCAL_USER = "local"  # whom quotas and usage count the requests of without login


@dataclass(frozen=True)
class Caller:
    """Who a request acts as: a user name and their role (None without login)."""

    user: str
    role: str | None = None


def api_enabled(cfg: AppConfig) -> bool:
    """Whether the API answers at all: api.enabled, or by default whether login is on."""
    return cfg.auth.enabled if cfg.api.enabled is None else cfg.api.enabled


def bearer(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    return header[7:].strip() or None if header.lower().startswith("bearer ") else None


class ApiAccess:
    """Decides, for each request, whom it acts as (or raises ApiError)."""

    def __init__(
        self, cfg: AppConfig, keys: KeyStore | None, accounts: Accounts | None, identify: Identify = no_login
    ) -> None:
        self.login = cfg.auth.enabled
        self.enabled = api_enabled(cfg)
        self.keys = keys
        self.accounts = accounts if accounts is not None or not self.login else Accounts.from_config(cfg)
        self.identify = identify

    async def caller(self, request: Request) -> Caller:
        """The API caller: a key's user (with login), else this machine's LOCAL_USER."""
        if not self.enabled:
            raise ApiError.of("api.off")
        if not self.login:
            if not local_request(request):
                raise ApiError.of("api.remote", host=request.client.host if request.client else "?")
            return Caller(LOCAL_USER)
        key = bearer(request)
        if key is None:
            raise ApiError.of("api.no_key")
        assert self.accounts is not None
        user = await self.keys.owner(key) if self.keys is not None else None
        role = self.accounts.role(user) if user is not None else None
        if user is None or role is None:  # a removed user's keys stop working with them
            raise ApiError.of("api.bad_key")
        return Caller(user, role)

    def browser_user(self, request: Request) -> Caller:
        """The logged-in user of the key page (its own page only), or ApiError."""
        if not self.login:
            raise ApiError.of("api.login_needed")
        assert self.accounts is not None
        user = self.identify(request)
        role = self.accounts.role(user) if user is not None else None
        if user is None or role is None:
            raise ApiError.of("api.login_needed")
        return Caller(user, role)
