"""The organisation's sign-in on the app's port: OpenID Connect (auth.oidc) and a sign-in proxy's headers (auth.proxy).

Chainlit 2.12's own OAuth routes trust too much for this (its generic provider reads the userinfo endpoint and checks
no ID token; no PKCE, no nonce; the redirect URI comes from the request's Host), and its header callback does not
know the client's address. So the app shows Chainlit's button (a provider registered under auth.oidc.button) and
takes over the routes behind it, in front of Chainlit's:
- GET /auth/oauth/<button>: a new sign-in (backend.accounts.oidc.start); its state, nonce and PKCE verifier go into
  a sealed, HttpOnly cookie for 10 minutes, the browser to the provider;
- GET /auth/oauth/<button>/callback: the state checked against that cookie, the code exchanged, the ID token
  verified, the user's account found or made (backend.api.sso_accounts) with the role their groups give, and the
  session started as Chainlit starts any (its login cookie, then its /login/callback page);
- POST /auth/header: a proxy's headers, believed only from auth.proxy.trusted addresses.
A sign-in that fails answers a page in the user's language saying why and what to do, with a way back to the login.
Every app process re-reads the accounts' roles every ROLES_REFRESH_S, so a sign-in on one holds on all."""

from __future__ import annotations

import asyncio
import html
import ipaddress
import logging
import os
import time
from dataclasses import dataclass
from typing import Any

from fastapi import Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.routing import APIRoute

from backend.accounts.login import SECRET_ENV, Accounts, login_metadata
from backend.accounts.oidc import START_S, Identity, OidcClient, groups_of, identity_of, role_for, seal, unseal
from backend.api.router import Gateway
from backend.api.sso_accounts import SsoAccounts
from backend.config import AppConfig, AuthSettings, load_config
from backend.errors import ConfigError, SignInError, StorageError, lang_of
from backend.storage.shared import SharedDatabase

log = logging.getLogger(__name__)

COOKIE = "ernie_sign_in"
ROLES_REFRESH_S = 10.0
PROXY_ISSUER = "proxy"  # the issuer recorded for a proxy's users


@dataclass(frozen=True)
class Ways:
    """How people sign in, from the configuration (all False without login)."""

    password: bool = False
    oidc: bool = False
    proxy: bool = False
    button: str = ""


def ways(cfg: AppConfig | None = None) -> Ways:
    """The configured ways in (read as app.py is imported, which registers Chainlit's hooks for them)."""
    try:
        auth: AuthSettings = (cfg or load_config()).auth
    except ConfigError:
        return Ways()
    if not auth.enabled:
        return Ways()
    return Ways(auth.password, auth.oidc.enabled, auth.proxy.enabled, auth.oidc.button)


def show_button(button: str) -> None:
    """Make Chainlit's login page offer "Continue with <Button>" (SignIn.routes take over its routes)."""
    from chainlit import oauth_providers

    if button in oauth_providers.get_configured_oauth_providers():
        return
    provider = oauth_providers.OAuthProvider()
    provider.id, provider.env = button, []  # no variables needed: always "configured", as the app's configuration says
    provider.authorize_url, provider.authorize_params = f"/auth/oauth/{button}", {}
    oauth_providers.providers.insert(0, provider)


def _failed(request: Request, exc: SignInError, status: int = 400) -> HTMLResponse:
    """A page saying why the sign-in failed and what to do, in the browser's language, with the way back."""
    locale = request.headers.get("accept-language", "en")
    message, hint = exc.localized(locale)
    zh = lang_of(locale) == "zh"
    title, back = ("登录失败", "返回登录页") if zh else ("Sign-in failed", "Back to the sign-in page")
    body = (
        f'<!doctype html><html lang="{"zh-CN" if zh else "en"}"><head><meta charset="utf-8">'
        f"<title>{title}</title></head>"
        f'<body><main id="sign-in-failed"><h1>{title}</h1><p>{html.escape(message)}</p><p>{html.escape(hint)}</p>'
        f'<p><a href="/login">{back}</a></p></main></body></html>'
    )
    response = HTMLResponse(body, status_code=status)
    response.delete_cookie(COOKIE, path="/auth/oauth")
    return response


class SignIn:
    """The organisation's sign-in: its routes, its accounts, the roles every process knows."""

    def __init__(
        self, cfg: AppConfig, accounts: Accounts, db: SharedDatabase, client: OidcClient | None = None
    ) -> None:
        self.auth = cfg.auth
        self.accounts = accounts
        self.store = SsoAccounts(db)
        self.client = client if client is not None or not cfg.auth.oidc.enabled else OidcClient(cfg.auth.oidc)
        self.networks = [ipaddress.ip_network(a, strict=False) for a in cfg.auth.proxy.trusted]
        self._refresh: asyncio.Task[None] | None = None
        self._read_at = 0.0  # when role_now last read the accounts (time.monotonic)

    # ----- the roles every process knows ------------------------------------------------------------------------
    async def start(self) -> None:
        """Read the accounts' roles now and every ROLES_REFRESH_S (a sign-in on another process counts here too)."""
        await self._read_roles()
        self._refresh = asyncio.create_task(self._refresh_roles(), name="sign-in roles")

    async def _read_roles(self) -> None:
        try:
            self.accounts.know_sso(await self.store.roles(), replace=True)
        except StorageError as exc:
            log.error("The organisation's accounts were not read: %s", exc)

    async def _refresh_roles(self) -> None:
        while True:
            await asyncio.sleep(ROLES_REFRESH_S)
            await self._read_roles()

    async def role_now(self, name: str) -> str | None:
        """The role of `name`, reading the accounts again when this process has not heard of them yet (signed in on
        another process since the last refresh; at most once a second)."""
        if self.accounts.role(name) is None and not self.accounts.knows(name):
            now = time.monotonic()
            if now - self._read_at >= 1.0:
                self._read_at = now
                await self._read_roles()
        return self.accounts.role(name)

    async def stop(self) -> None:
        if self._refresh is not None:
            self._refresh.cancel()
        if self.client is not None:
            await self.client.close()

    # ----- signing in -------------------------------------------------------------------------------------------
    async def enter(self, request: Request, who: Identity, provider: str) -> Response:
        """Find or make the account of `who`, with the role their groups give, and start its session (Chainlit's)."""
        import chainlit.server as chainlit_server
        from chainlit.user import User

        oidc = self.auth.oidc
        role = role_for(who.groups, oidc.roles, oidc.default_role)
        account = await self.store.sign_in(who, role, self.accounts.password_names())
        self.accounts.know_sso({account.name: role})
        if self.accounts.role(account.name) is None:
            log.info("Sign-in of %r refused: in none of the allowed groups (%s)", account.name, ", ".join(who.groups))
            raise SignInError.of("sso.no_role", name=account.name)
        log.info("%r signed in through %s (role %s)", account.name, provider, self.accounts.role(account.name))
        metadata = {**login_metadata(provider), **({"email": who.email} if who.email else {})}
        return await chainlit_server._authenticate_user(  # the login cookie as Chainlit makes it
            request, User(identifier=account.name, metadata=metadata), redirect_to_callback=provider == "oidc"
        )

    async def oidc_start(self, request: Request) -> Response:
        assert self.client is not None
        try:
            begun = await self.client.start()
        except SignInError as exc:
            return _failed(request, exc, 502)
        response = RedirectResponse(begun.url, status_code=302)
        kept = {"state": begun.state, "nonce": begun.nonce, "verifier": begun.verifier}
        response.set_cookie(
            COOKIE, seal(kept, os.environ[SECRET_ENV]), max_age=int(START_S), path="/auth/oauth", httponly=True,
            samesite="lax", secure=request.url.scheme == "https",
        )  # fmt: skip
        return response

    async def oidc_callback(self, request: Request) -> Response:
        assert self.client is not None
        query = request.query_params
        try:
            if query.get("error"):
                raise SignInError.of("sso.provider_error", error=query.get("error_description") or query["error"])
            kept = unseal(request.cookies.get(COOKIE), os.environ[SECRET_ENV])
            code, state = query.get("code"), query.get("state")
            if not code or not state:
                raise SignInError.of("sso.wrong_state")
            who = await self.client.finish(code, state, kept)
            response = await self.enter(request, who, "oidc")
        except SignInError as exc:
            log.warning("Sign-in failed: %s", exc.message)
            return _failed(request, exc, 502 if exc.code == "sso.unreachable" else 403)
        except StorageError as exc:
            log.error("Sign-in not recorded: %s", exc)
            return _failed(request, SignInError(str(exc)), 503)
        response.delete_cookie(COOKIE, path="/auth/oauth")
        return response

    async def proxy_login(self, request: Request) -> Response:
        proxy = self.auth.proxy
        address = request.client.host if request.client else "?"
        try:
            try:
                trusted = any(ipaddress.ip_address(address) in n for n in self.networks)
            except ValueError:
                trusted = False
            if not trusted:
                log.warning("Sign-in headers from %s refused: not in auth.proxy.trusted", address)
                raise SignInError.of("sso.proxy_untrusted", address=address)
            name = request.headers.get(proxy.user_header, "").strip()
            if not name:
                raise SignInError.of("sso.proxy_no_user", header=proxy.user_header)
            email = request.headers.get(proxy.email_header, "").strip() or None
            claims: dict[str, Any] = {"sub": name, "name": name, "email": email, "email_verified": bool(email),
                                      "groups": groups_of(request.headers.get(proxy.groups_header, ""))}  # fmt: skip
            who = identity_of(PROXY_ISSUER, claims, "name", "groups")
            return await self.enter(request, who, "proxy")
        except SignInError as exc:
            return _failed(request, exc, 401)
        except StorageError as exc:
            log.error("Sign-in not recorded: %s", exc)
            return _failed(request, SignInError(str(exc)), 503)

    def routes(self) -> list[APIRoute]:
        found: list[APIRoute] = []
        if self.client is not None:
            button = self.auth.oidc.button
            found += [
                APIRoute(f"/auth/oauth/{button}", self.oidc_start, methods=["GET"], include_in_schema=False),
                APIRoute(
                    f"/auth/oauth/{button}/callback", self.oidc_callback, methods=["GET"], include_in_schema=False
                ),
            ]
        if self.auth.proxy.enabled:
            found.append(APIRoute("/auth/header", self.proxy_login, methods=["POST"], include_in_schema=False))
        return found


async def open_sign_in(cfg: AppConfig, api: Gateway | None) -> SignIn | None:
    """The organisation's sign-in when auth.oidc or auth.proxy is on and the database is open (its accounts live
    there), its roles read; else None (the log says why when it was asked for)."""
    if not (cfg.auth.enabled and (cfg.auth.oidc.enabled or cfg.auth.proxy.enabled)):
        return None
    if api is None or api.db is None or api.problem is not None or api.access.accounts is None:
        log.error("The organisation's sign-in is off: the app's database is not open (its accounts live there).")
        return None
    sign_in = SignIn(cfg, api.access.accounts, api.db)
    await sign_in.start()
    return sign_in
