"""The organisation's sign-in in headless Chromium, in English and Chinese: the login page's button, the real OpenID
Connect provider's own sign-in page (tests/oidc_server.py), back in the chat as that user, who chats and whose role
the groups gave; a user in no allowed group gets a page in their language saying why, and no chat. The protocol's
refusals (state, tokens, names, proxies) are tested over HTTP in tests/integration/test_sso.py."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from backend.accounts.passwords import hash_password
from backend.accounts.users import write_users_file
from backend.serving.process import free_port
from tests.app_process import READY, RunningApp, launch_app, login_env
from tests.browser.pages import send, wait_finished
from tests.oidc_server import OidcProvider
from tests.sso_flow import callback_uri, oidc_env

pytestmark = [pytest.mark.browser, pytest.mark.integration, pytest.mark.slow]

# locale: (the button's words, the refusal of a user in no allowed group)
LOCALES = {
    "en-US": ("Organisation", "is not in a group allowed to use this chat"),
    "zh-CN": ("Organisation", "不在允许使用此聊天的组中"),
}
# The signed-in user's threads, as the chat's sidebar asks for them
THREADS = """() => fetch('/project/threads', {method: 'POST', headers: {'Content-Type': 'application/json'},
  body: JSON.stringify({pagination: {first: 20}, filter: {}})}).then(r => r.json())"""


@dataclass
class Site:
    app: RunningApp
    provider: OidcProvider


@pytest.fixture(scope="module")
def site(spm_model: Path, oidc_provider: OidcProvider, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    root = tmp_path_factory.mktemp("sso-ui")
    users = root / "users.yaml"
    write_users_file(users, {"carol": hash_password("carol-password")})  # password login stays on beside it
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    oidc_provider.set_redirect_uris([callback_uri(url)])
    env = login_env(root / "data", spm_model, users, engine="llama.cpp") | oidc_env(oidc_provider, url)
    app = launch_app(env, root / "app.log", port=port)
    try:
        app.wait_ready()
        yield Site(app, oidc_provider)
    finally:
        app.stop()


async def through_the_provider(browser, site: Site, locale: str, name: str, password: str):  # type: ignore[no-untyped-def]
    """A new page of `locale`: the app's login page, its organisation button, the provider's sign-in page filled."""
    page = await (await browser.new_context(locale=locale)).new_page()
    await page.goto(site.app.url)
    await page.wait_for_selector("#email", timeout=60_000)  # the password form stays, beside the button
    await page.get_by_role("button", name=LOCALES[locale][0]).click()
    await page.wait_for_url(f"{site.provider.login_url}**", timeout=60_000)
    await page.fill("#id_username", name)
    await page.fill("#id_password", password)
    await page.get_by_role("button", name="Sign in").click()
    return page


@pytest.mark.parametrize("locale", LOCALES)
async def test_sign_in_with_the_organisations_account_and_chat(browser, site: Site, locale: str) -> None:  # type: ignore[no-untyped-def]
    name, password = f"u{secrets.token_hex(4)}", secrets.token_urlsafe(12)
    site.provider.set_user(name, password, f"{name}@example.test", ["chat-editors"])
    page = await through_the_provider(browser, site, locale, name, password)
    await page.wait_for_selector(READY, timeout=60_000)  # back in the chat, signed in
    me = await page.evaluate("() => fetch('/workshop/api/me').then(r => r.json())")
    assert (me.get("user"), me.get("role")) == (name, "editor"), me
    await send(page, "Hello")
    await wait_finished(page, 0)  # a reply, finished (the tiny model's words mean nothing)
    threads = await page.evaluate(THREADS)
    assert [t["name"] for t in threads["data"]] == ["Hello"], "their chat is kept in their own history"
    await page.context.close()


@pytest.mark.parametrize("locale", LOCALES)
async def test_a_user_in_no_allowed_group_is_told_why_in_their_language(browser, site: Site, locale: str) -> None:  # type: ignore[no-untyped-def]
    name, password = f"u{secrets.token_hex(4)}", secrets.token_urlsafe(12)
    site.provider.set_user(name, password, f"{name}@example.test", ["another-team"])
    page = await through_the_provider(browser, site, locale, name, password)
    await page.wait_for_selector("#sign-in-failed", timeout=60_000)
    assert LOCALES[locale][1] in await page.inner_text("#sign-in-failed")
    await page.get_by_role("link").click()  # back to the sign-in page
    await page.wait_for_selector("#email", timeout=60_000)
    await page.context.close()
