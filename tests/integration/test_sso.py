"""The organisation's sign-in against a real OpenID Connect provider (Django with django-oauth-toolkit, started by the
tests: tests/oidc_server.py) and the real app process (llama.cpp on the tiny ERNIE model), on SQLite and PostgreSQL.

A browser's way through it is driven with httpx (tests/sso_flow.py), step by step: the app's button, the provider's
sign-in form, the app's callback. What is checked: the first sign-in makes the account with the role its groups give
(history, workshop rights and API keys as a password user's); a user moved to another group gets that role at the
next sign-in, one in no allowed group cannot sign in and their open session ends; a state that is not the sign-in's,
a callback nobody started and a provider's refusal are refused with a page in the user's language; an ID token of the
real provider that expired, was altered or signed by another key is refused; a name a password account holds is
refused until an admin links it; a sign-in proxy's headers count only from its trusted address.
The same sign-in in a real browser: tests/browser/test_sso_ui.py."""

from __future__ import annotations

import base64
import html
import json
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from backend.accounts.oidc import OidcClient
from backend.accounts.passwords import hash_password
from backend.accounts.users import write_users_file
from backend.config import OidcSettings
from backend.errors import SignInError
from backend.serving.process import free_port
from tests.app_process import ROOT, RunningApp, launch_app, login_env
from tests.oidc_server import OidcProvider
from tests.sso_flow import callback_uri, oidc_env, sign_in, signed_in_role, through_provider
from tests.stub_engine import StubEngine
from tests.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PASSWORDS = {"carol": "carol-password"}  # a password account whose name the provider also has
PROXY = "127.0.0.2"  # the only address the app believes a sign-in proxy's headers from
THREADS = {"pagination": {"first": 20}, "filter": {}}


@dataclass
class Site:
    app: RunningApp
    provider: OidcProvider
    env: dict[str, str]


@pytest.fixture(scope="module")
def site(
    spm_model: Path, oidc_provider: OidcProvider, tmp_path_factory: pytest.TempPathFactory, app_db_url: str
) -> Iterator[Site]:
    root = tmp_path_factory.mktemp("sso")
    users = root / "users.yaml"
    write_users_file(users, {n: hash_password(p) for n, p in PASSWORDS.items()}, {"carol": "editor"})
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    oidc_provider.set_redirect_uris([callback_uri(url)])
    env = login_env(root / "data", spm_model, users, app_db_url, engine="llama.cpp")
    env |= oidc_env(oidc_provider, url, ERNIE_AUTH__PROXY__ENABLED="true", ERNIE_AUTH__PROXY__TRUSTED=f"[{PROXY}]")
    app = launch_app(env, root / "app.log", port=port)
    try:
        app.wait_ready()
        yield Site(app, oidc_provider, env)
    finally:
        app.stop()


def new_user(site: Site, groups: list[str], email: str | None = None) -> tuple[str, str]:
    """A user of the provider of its own (tests run in any order): (name, password)."""
    name, password = f"u{secrets.token_hex(4)}", secrets.token_urlsafe(12)
    site.provider.set_user(name, password, email or f"{name}@example.test", groups)
    return name, password


def backend_command(site: Site, *args: str) -> subprocess.CompletedProcess[str]:
    """`python -m backend ARGS` with the app's configuration (its database)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ERNIE_")} | site.env
    argv = [sys.executable, "-m", "backend", *args]
    return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False)


OPEN: list[httpx.Client] = []  # every client a test made, closed after it (no socket left to a later test)


@pytest.fixture(autouse=True)
def _closed_clients() -> Iterator[None]:
    yield
    while OPEN:
        OPEN.pop().close()


def client(**options: object) -> httpx.Client:
    made = httpx.Client(timeout=60, **options)  # type: ignore[arg-type]
    OPEN.append(made)
    return made


def browser(locale: str = "en-US") -> httpx.Client:
    return client(follow_redirects=False, headers={"Accept-Language": locale})


def signed_in(site: Site, name: str, password: str) -> httpx.Client:
    who = browser()
    _, answer = sign_in(who, site.app.url, site.provider, name, password)
    assert answer.status_code == 302, (answer.status_code, answer.text[:1000], site.app.log_text()[-3000:])
    assert urlsplit(answer.headers["location"]).path == "/login/callback"
    return who


def refused_page(answer: httpx.Response) -> str:
    assert answer.status_code in (401, 403, 502), (answer.status_code, answer.text[:500])
    assert 'id="sign-in-failed"' in answer.text and 'href="/login"' in answer.text
    assert not any(c.startswith("access_token") for c in answer.cookies), "no session for a refused sign-in"
    return html.unescape(answer.text)


def test_the_first_sign_in_makes_the_account_and_every_sign_in_sets_its_role(site: Site) -> None:
    name, password = new_user(site, ["chat-users", "chat-editors"])
    first = signed_in(site, name, password)
    assert signed_in_role(first, site.app.url) == (name, "editor")
    threads = first.post(f"{site.app.url}/project/threads", json=THREADS, headers={"Origin": site.app.url})
    assert threads.status_code == 200 and threads.json()["data"] == [], threads.text  # their own history, empty

    # API keys as a password user's: an admin makes one for the new account; a tool uses it
    made = backend_command(site, "api-key", "create", name)
    assert made.returncode == 0, made.stderr
    key = made.stdout.strip().splitlines()[-1]
    models = client().get(f"{site.app.url}/v1/models", headers={"Authorization": f"Bearer {key}"})
    assert models.status_code == 200, models.text

    site.provider.set_groups(name, ["chat-users"])  # moved out of the editors at the provider
    assert signed_in_role(first, site.app.url) == (name, "editor"), "the open session keeps its role until..."
    second = signed_in(site, name, password)
    me = second.get(f"{site.app.url}/workshop/api/me").json()
    assert me["may_edit"] is False and name in json.dumps(me), me  # signed in, but no editor any more
    assert signed_in_role(first, site.app.url) == (None, None), "...the next sign-in: the role is the account's"

    site.provider.set_groups(name, ["other-team"])  # in no allowed group now
    refused = refused_page(sign_in(browser(), site.app.url, site.provider, name, password)[1])
    assert f"{name} is not in a group allowed to use this chat" in refused
    gone = second.post(f"{site.app.url}/project/threads", json=THREADS, headers={"Origin": site.app.url})
    assert gone.status_code == 401, "their open sessions end with their role"
    models = client().get(f"{site.app.url}/v1/models", headers={"Authorization": f"Bearer {key}"})
    assert models.status_code == 401, "and so do their keys"


def test_a_callback_that_is_not_the_sign_ins_own_is_refused_in_the_users_language(site: Site) -> None:
    url = site.app.url
    for locale, wrong_state, not_started in [
        ("en-US", "does not belong to this sign-in", "was not started here"),
        ("zh-CN", "不属于此次登录", "不是从本页面发起的"),
    ]:
        tab = browser(locale)
        start = tab.get(f"{url}/auth/oauth/organisation")
        state = parse_qs(urlsplit(start.headers["location"]).query)["state"][0]
        answer = tab.get(f"{url}/auth/oauth/organisation/callback", params={"code": "x", "state": state + "x"})
        assert wrong_state in refused_page(answer)
        answer = browser(locale).get(f"{url}/auth/oauth/organisation/callback", params={"code": "x", "state": state})
        assert not_started in refused_page(answer), "no sealed cookie: nobody started it in this browser"
        answer = tab.get(f"{url}/auth/oauth/organisation/callback", params={"error": "access_denied"})
        assert "access_denied" in refused_page(answer)


def test_a_user_in_no_allowed_group_cannot_sign_in(site: Site) -> None:
    name, password = new_user(site, ["other-team"])
    who = browser("zh-CN")
    refused = refused_page(sign_in(who, site.app.url, site.provider, name, password)[1])
    assert f"{name} 不在允许使用此聊天的组中" in refused
    assert signed_in_role(who, site.app.url) == (None, None)


def test_a_name_a_password_account_holds_needs_an_admins_link(site: Site) -> None:
    site.provider.set_user("carol", "carol-at-the-provider", "carol@example.test", ["chat-users"])
    refused = refused_page(sign_in(browser(), site.app.url, site.provider, "carol", "carol-at-the-provider")[1])
    assert 'An account named "carol" already exists here' in refused and "link-account carol" in refused

    linked = backend_command(site, "link-account", "carol", "--email", "carol@example.test")
    assert linked.returncode == 0, linked.stderr
    carol = signed_in(site, "carol", "carol-at-the-provider")
    assert signed_in_role(carol, site.app.url) == ("carol", "editor"), "the password account's role (users file)"


async def real_id_token(oidc: OidcClient, site: Site, name: str, password: str) -> tuple[str, str]:
    """An ID token the real provider issued for `name` (signed in with httpx, the code exchanged): (token, nonce)."""
    begun = await oidc.start()
    page = through_provider(browser(), begun.url, site.provider, name, password, oidc.redirect_uri)
    code = parse_qs(urlsplit(page.headers["location"]).query)["code"][0]
    tokens = client().post(
        site.provider.discovery()["token_endpoint"],
        data={"grant_type": "authorization_code", "code": code, "redirect_uri": oidc.redirect_uri,
              "code_verifier": begun.verifier},
        auth=(site.provider.client_id, site.provider.client_secret),
    )  # fmt: skip
    assert tokens.status_code == 200, tokens.text
    return tokens.json()["id_token"], begun.nonce


async def test_an_id_token_of_the_real_provider_that_expired_was_altered_or_forged_is_refused(site: Site) -> None:
    settings = OidcSettings(
        enabled=True, issuer=site.provider.issuer, client_id=site.provider.client_id,
        client_secret=site.provider.client_secret, redirect_uri=callback_uri(site.app.url),
    )  # fmt: skip
    name, password = new_user(site, ["chat-users"])
    oidc, other_client = OidcClient(settings), OidcClient(settings.model_copy(update={"client_id": "another-app"}))
    try:
        token, nonce = await real_id_token(oidc, site, name, password)
        claims = await oidc.verify(token, nonce)
        assert claims["preferred_username"] == name and claims["groups"] == ["chat-users"]

        oidc.clock = lambda: float(claims["exp"]) + 61  # the same token, checked a minute after it expired
        with pytest.raises(SignInError, match="expired"):
            await oidc.verify(token, nonce)
        oidc.clock = time.time
        header, payload, signature = token.split(".")
        promoted = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
        promoted["groups"] = ["chat-admins"]
        altered = base64.urlsafe_b64encode(json.dumps(promoted).encode()).rstrip(b"=").decode()
        with pytest.raises(SignInError, match="Signature"):
            await oidc.verify(f"{header}.{altered}.{signature}", nonce)
        own_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        kid = jwt.get_unverified_header(token)["kid"]
        forged = jwt.encode(promoted, own_key, algorithm="RS256", headers={"kid": kid})
        with pytest.raises(SignInError, match="Signature"):
            await oidc.verify(forged, nonce)
        with pytest.raises(SignInError, match="nonce"):
            await oidc.verify(token, "another sign-in's nonce")
        with pytest.raises(SignInError, match="another client"):
            await other_client.verify(token, nonce)
    finally:
        await oidc.close()
        await other_client.close()


def test_a_sign_in_proxys_headers_count_only_from_its_trusted_address(site: Site) -> None:
    name = f"p{secrets.token_hex(4)}"
    headers = {"X-Forwarded-Preferred-Username": name, "X-Forwarded-Email": f"{name}@example.test",
               "X-Forwarded-Groups": "chat-users,chat-admins", "Origin": site.app.url}  # fmt: skip
    refused = client().post(f"{site.app.url}/auth/header", headers=headers)  # from 127.0.0.1
    assert "is not a trusted sign-in proxy" in refused_page(refused)
    proxy = client(transport=httpx.HTTPTransport(local_address=PROXY))
    answer = proxy.post(f"{site.app.url}/auth/header", headers=headers)
    assert answer.status_code == 200, (answer.status_code, answer.text[:500])
    assert any(c.startswith("access_token") for c in answer.cookies)
    assert signed_in_role(proxy, site.app.url) == (name, "admin")
    nobody = proxy.post(f"{site.app.url}/auth/header", headers={"Origin": site.app.url})
    assert "sent no user name" in refused_page(nobody)


def test_a_logout_ends_the_organisations_session_on_the_server(site: Site) -> None:
    name, password = new_user(site, ["chat-editors"])
    who = signed_in(site, name, password)
    kept = dict(who.cookies)
    out = who.post(f"{site.app.url}/logout", headers={"Origin": site.app.url})
    assert out.status_code == 200, out.text
    again = client(cookies=kept)  # the old cookie, kept by someone
    assert signed_in_role(again, site.app.url) == (None, None), "ended on the server, not only in the browser"
    gone = again.post(f"{site.app.url}/project/threads", json=THREADS, headers={"Origin": site.app.url})
    assert gone.status_code == 401


def test_password_login_can_be_turned_off_beside_the_organisations_sign_in(
    oidc_provider: OidcProvider, tmp_path: Path
) -> None:
    users = tmp_path / "users.yaml"
    write_users_file(users, {"carol": hash_password("carol-password")})
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with StubEngine() as engine:  # the engine does not matter here: the login page's ways in do
        env = login_env(tmp_path / "data", Path("unused"), users) | oidc_env(oidc_provider, url)
        env |= {f"ERNIE_{k.upper()}": v for k, v in engine.app_overrides().items()} | {"ERNIE_AUTH__PASSWORD": "false"}
        env.pop("ERNIE_MODEL__ID")
        app = launch_app(env, tmp_path / "app.log", port=port)
        try:
            wait_until(app.answering, "the app's page")
            ways = client().get(f"{url}/auth/config").json()
            assert (ways["passwordAuth"], ways["oauthProviders"]) == (False, ["organisation"]), ways
            form = {"username": "carol", "password": "carol-password"}
            refused = client().post(f"{url}/login", data=form, headers={"Origin": url})
            assert refused.status_code >= 400 and not any(c.startswith("access_token") for c in refused.cookies)
        finally:
            app.stop()
