"""The organisation's sign-in as a browser goes through it, with httpx: the app's button, the real provider's
sign-in form (tests/oidc_server.py), back to the app's callback (tests/integration/test_sso.py, the browser test)."""

from __future__ import annotations

import html
import re

import httpx

from tests.oidc_server import OidcProvider

BUTTON = "organisation"


def oidc_env(provider: OidcProvider, app_url: str, **extra: str) -> dict[str, str]:
    """ERNIE_* settings of an app signing in through `provider` (with login_env's), roles from three groups; a user in
    none of them cannot sign in."""
    return {
        "ERNIE_AUTH__OIDC__ENABLED": "true",
        "ERNIE_AUTH__OIDC__ISSUER": provider.issuer,
        "ERNIE_AUTH__OIDC__CLIENT_ID": provider.client_id,
        "ERNIE_AUTH__OIDC__CLIENT_SECRET": provider.client_secret,
        "ERNIE_AUTH__OIDC__REDIRECT_URI": callback_uri(app_url),
        "ERNIE_AUTH__OIDC__ROLES": "{chat-users: user, chat-editors: editor, chat-admins: admin}",
        "ERNIE_AUTH__OIDC__DEFAULT_ROLE": "",
        **extra,
    }


def callback_uri(app_url: str) -> str:
    return f"{app_url}/auth/oauth/{BUTTON}/callback"


def provider_form(page: httpx.Response, name: str, password: str) -> dict[str, str]:
    """The provider's sign-in form filled in (its CSRF token and where it goes next kept)."""
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text)
    next_url = re.search(r'name="next" value="([^"]+)"', page.text)
    assert token and next_url, page.text[:2000]
    return {"csrfmiddlewaretoken": token[1], "username": name, "password": password, "next": html.unescape(next_url[1])}


def through_provider(
    browser: httpx.Client, authorize_url: str, provider: OidcProvider, name: str, password: str, back_to: str
) -> httpx.Response:
    """From the provider's authorization URL, through its sign-in form if it shows one, to its redirect to `back_to`
    (returned, not followed). `browser` follows no redirects by itself: each step is checked on the way."""
    page = browser.get(authorize_url)
    while page.status_code in (301, 302, 303) and not page.headers["location"].startswith(back_to):
        page = browser.get(httpx.URL(str(page.url)).join(page.headers["location"]))
    if page.status_code == 200:  # not signed in at the provider yet: its form
        posted = browser.post(
            str(page.url), data=provider_form(page, name, password), headers={"Origin": provider.base_url}
        )
        assert posted.status_code == 302, (posted.status_code, posted.text[:1000], provider.log_tail())
        page = posted
        while not page.headers["location"].startswith(back_to):
            page = browser.get(httpx.URL(str(page.url)).join(page.headers["location"]))
            assert page.status_code in (301, 302, 303), (page.status_code, page.text[:1000])
    assert page.headers["location"].startswith(back_to), page.headers["location"]
    return page


def sign_in(
    browser: httpx.Client, app_url: str, provider: OidcProvider, name: str, password: str
) -> tuple[httpx.Response, httpx.Response]:
    """From the app's button to the app's callback: (the provider's redirect to it, the app's answer to it)."""
    start = browser.get(f"{app_url}/auth/oauth/{BUTTON}")
    assert start.status_code == 302, (start.status_code, start.text[:500])
    back = through_provider(browser, start.headers["location"], provider, name, password, callback_uri(app_url))
    return back, browser.get(back.headers["location"])


def signed_in_role(browser: httpx.Client, app_url: str) -> tuple[str | None, str | None]:
    """(user, role) the app sees for `browser`'s login cookie (the workshop's /me: None when not an editor)."""
    me = browser.get(f"{app_url}/workshop/api/me").json()
    return me.get("user"), me.get("role")
