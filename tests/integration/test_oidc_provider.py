"""The tests' OpenID Connect provider itself (tests/oidc_server.py, Django with django-oauth-toolkit), as a client sees
it: discovery; the authorization-code flow with PKCE done with httpx as a browser does it (the sign-in form with its
CSRF token, back to the redirect URI: a small server on 127.0.0.1 that keeps what it was given); the ID token verified
against the JWKS with PyJWT; userinfo; a group change by the admin command in the next sign-in's token; a token request
without the code verifier refused."""

from __future__ import annotations

import base64
import hashlib
import html
import queue
import re
import secrets
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import jwt
import pytest

from tests.http_server import ThreadedServer
from tests.oidc_server import OidcProvider

pytestmark = pytest.mark.integration

SCOPE = "openid profile email"


class Callback:
    """The redirect URI: a server on 127.0.0.1 (as the app's) that answers 200 and keeps each query it was given."""

    def __init__(self) -> None:
        received: queue.Queue[dict[str, str]] = queue.Queue()

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                received.put({k: v[0] for k, v in parse_qs(urlsplit(self.path).query).items()})
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: Any) -> None:
                pass

        self.received = received
        self.server = ThreadedServer(Handler, "oidc-callback")
        self.uri = f"{self.server.url}/auth/oauth/oidc/callback"


@pytest.fixture(scope="module")
def callback() -> Iterator[Callback]:
    cb = Callback()
    with cb.server:
        yield cb


@pytest.fixture(scope="module")
def provider(oidc_provider: OidcProvider, callback: Callback) -> OidcProvider:
    oidc_provider.set_redirect_uris([callback.uri])
    oidc_provider.set_user("alice", "alice-pw", "alice@example.test", ["chat-users", "chat-editors"], "Alice Liddell")
    return oidc_provider


def pkce() -> tuple[str, str]:
    verifier = secrets.token_urlsafe(48)
    challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
    return verifier, challenge


def sign_in(
    provider: OidcProvider, callback: Callback, browser: httpx.Client, password: str = "alice-pw"
) -> tuple[httpx.Response, dict[str, str]]:
    """The browser's part: the authorization request, then the sign-in form if the provider shows it. Returns the
    last page and the request's secrets (code_verifier, state, nonce)."""
    verifier, challenge = pkce()
    flow = {"code_verifier": verifier, "state": secrets.token_urlsafe(16), "nonce": secrets.token_urlsafe(16)}
    params = {
        "response_type": "code",
        "client_id": provider.client_id,
        "redirect_uri": callback.uri,
        "scope": SCOPE,
        "state": flow["state"],
        "nonce": flow["nonce"],
        "code_challenge": challenge,
        "code_challenge_method": "S256",
    }
    page = browser.get(provider.discovery()["authorization_endpoint"], params=params)
    if str(page.url).startswith(provider.login_url):
        assert "Sign in" in page.text, page.text
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text)
        next_url = re.search(r'name="next" value="([^"]+)"', page.text)
        assert token and next_url, page.text
        form = {"csrfmiddlewaretoken": token[1], "username": "alice", "password": password}
        form["next"] = html.unescape(next_url[1])
        page = browser.post(str(page.url), data=form, headers={"Origin": provider.base_url})
    return page, flow


def authorize(provider: OidcProvider, callback: Callback, browser: httpx.Client) -> tuple[str, str, str]:
    """Signed in and back at the redirect URI: (code, code_verifier, nonce)."""
    page, flow = sign_in(provider, callback, browser)
    assert page.status_code == 200 and str(page.url).startswith(callback.uri), (page.url, provider.log_tail())
    query = callback.received.get(timeout=5)
    assert query.get("state") == flow["state"], query
    return query["code"], flow["code_verifier"], flow["nonce"]


def exchange(provider: OidcProvider, callback: Callback, code: str, verifier: str | None) -> httpx.Response:
    data = {"grant_type": "authorization_code", "code": code, "redirect_uri": callback.uri}
    if verifier is not None:
        data["code_verifier"] = verifier
    auth = (provider.client_id, provider.client_secret)
    return httpx.post(provider.discovery()["token_endpoint"], data=data, auth=auth, timeout=30)


def verified_claims(provider: OidcProvider, id_token: str, nonce: str) -> dict[str, Any]:
    jwks = httpx.get(provider.discovery()["jwks_uri"], timeout=10).json()
    kid = jwt.get_unverified_header(id_token)["kid"]
    key = next(jwt.PyJWK(k) for k in jwks["keys"] if k["kid"] == kid)
    claims = jwt.decode(id_token, key, algorithms=["RS256"], audience=provider.client_id, issuer=provider.issuer)
    assert claims["nonce"] == nonce
    return dict(claims)


def test_discovery(provider: OidcProvider) -> None:
    config = provider.discovery()
    assert config["issuer"] == provider.issuer == f"http://localhost:{provider.port}/o"
    for key, path in [
        ("authorization_endpoint", "/o/authorize/"),
        ("token_endpoint", "/o/token/"),
        ("userinfo_endpoint", "/o/userinfo/"),
        ("jwks_uri", "/o/.well-known/jwks.json"),
    ]:
        assert config[key] == f"http://localhost:{provider.port}{path}"
    assert config["code_challenge_methods_supported"] == ["S256"]
    assert "RS256" in config["id_token_signing_alg_values_supported"]
    assert {"openid", "profile", "email"} <= set(config["scopes_supported"])
    assert {"sub", "groups", "email", "preferred_username"} <= set(config["claims_supported"])


def test_code_flow_with_pkce(provider: OidcProvider, callback: Callback) -> None:
    with httpx.Client(follow_redirects=True, timeout=30) as browser:
        code, verifier, nonce = authorize(provider, callback, browser)
        assert set(browser.cookies.keys()) >= {"provider_session", "provider_csrf"}
        tokens = exchange(provider, callback, code, verifier)
        assert tokens.status_code == 200, (tokens.text, provider.log_tail())
        body = tokens.json()
        claims = verified_claims(provider, body["id_token"], nonce)
        alice = next(user for user in provider.users() if user["username"] == "alice")
        assert claims["sub"] == alice["sub"]
        assert claims["groups"] == ["chat-editors", "chat-users"]
        assert claims["email"] == "alice@example.test" and claims["email_verified"] is True
        assert claims["preferred_username"] == "alice" and claims["name"] == "Alice Liddell"
        assert 0 < claims["exp"] - claims["iat"] <= 300

        info = httpx.get(
            provider.discovery()["userinfo_endpoint"],
            headers={"Authorization": f"Bearer {body['access_token']}"},
            timeout=10,
        )
        assert info.status_code == 200, info.text
        assert {k: info.json()[k] for k in ("sub", "groups", "email", "preferred_username")} == {
            k: claims[k] for k in ("sub", "groups", "email", "preferred_username")
        }

        # A code is good once.
        assert exchange(provider, callback, code, verifier).status_code == 400

        # The admin command changes the groups; the next sign-in (the provider's session still open: no form) says so.
        provider.set_groups("alice", ["chat-users"])
        code, verifier, nonce = authorize(provider, callback, browser)
        tokens = exchange(provider, callback, code, verifier)
        assert tokens.status_code == 200, tokens.text
        assert verified_claims(provider, tokens.json()["id_token"], nonce)["groups"] == ["chat-users"]


def test_wrong_password_stays_on_the_form(provider: OidcProvider, callback: Callback) -> None:
    with httpx.Client(follow_redirects=True, timeout=30) as browser:
        page, _flow = sign_in(provider, callback, browser, password="wrong")
    assert str(page.url).startswith(provider.login_url) and "Wrong user name or password" in page.text
    assert callback.received.empty()


def test_pkce_is_required(provider: OidcProvider, callback: Callback) -> None:
    with httpx.Client(follow_redirects=True, timeout=30) as browser:
        code, _verifier, _nonce = authorize(provider, callback, browser)
        refused = exchange(provider, callback, code, None)
        assert refused.status_code == 400
        assert refused.json()["error"] in ("invalid_request", "invalid_grant"), refused.text

        # Nor does an authorization request without a code challenge get a code.
        params = {"response_type": "code", "client_id": provider.client_id, "redirect_uri": callback.uri}
        page = browser.get(provider.discovery()["authorization_endpoint"], params={**params, "scope": SCOPE})
        assert str(page.url).startswith(callback.uri)
        assert "code" not in callback.received.get(timeout=5)
