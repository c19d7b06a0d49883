"""The OpenID Connect protocol side (backend.accounts.oidc), on a provider made of httpx's MockTransport and keys made
here: every check of the ID token refuses what it should. The real provider's tests: tests/integration/test_sso.py."""

from __future__ import annotations

import base64
import hashlib
import json
import time
import urllib.parse
from typing import Any

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from backend.accounts.oidc import OidcClient, challenge, groups_of, identity_of, role_for, seal, unseal
from backend.config import OidcSettings
from backend.errors import SignInError

ISSUER = "https://sso.example.org/realms/team"
CLIENT = "chat"


def _key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


class Provider:
    """Discovery, JWKS and a token endpoint answering a given ID token; counts the JWKS fetches."""

    def __init__(self) -> None:
        self.key, self.kid = _key(), "k1"
        self.jwks_fetches = 0
        self.id_token = ""
        self.token_forms: list[dict[str, str]] = []

    def jwk(self) -> dict[str, Any]:
        jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(self.key.public_key()))
        return {**jwk, "kid": self.kid, "alg": "RS256", "use": "sig"}

    def handler(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path.endswith("/.well-known/openid-configuration"):
            return httpx.Response(200, json={
                "issuer": ISSUER, "authorization_endpoint": f"{ISSUER}/auth", "token_endpoint": f"{ISSUER}/token",
                "jwks_uri": f"{ISSUER}/certs", "token_endpoint_auth_methods_supported": ["client_secret_basic"],
            })  # fmt: skip
        if path.endswith("/certs"):
            self.jwks_fetches += 1
            return httpx.Response(200, json={"keys": [self.jwk()]})
        if path.endswith("/token"):
            self.token_forms.append(dict(urllib.parse.parse_qsl(request.content.decode())))
            return httpx.Response(200, json={"id_token": self.id_token, "access_token": "a", "token_type": "Bearer"})
        return httpx.Response(404)

    def token(
        self, key: rsa.RSAPrivateKey | None = None, alg: str = "RS256", kid: str | None = None, **claims: Any
    ) -> str:
        now = time.time()
        body = {"iss": ISSUER, "sub": "u-1", "aud": CLIENT, "iat": now, "exp": now + 300, "nonce": "n-1",
                "preferred_username": "alice", "email": "alice@example.org", "email_verified": True,
                "groups": ["chat-editors"]}  # fmt: skip
        body.update(claims)
        body = {k: v for k, v in body.items() if v is not None}
        signer: Any = key or self.key
        return jwt.encode(body, signer, algorithm=alg, headers={"kid": kid or self.kid})


def settings(**changes: Any) -> OidcSettings:
    base = {"enabled": True, "issuer": ISSUER, "client_id": CLIENT, "client_secret": "s3cret",
            "redirect_uri": "https://chat.example.org/auth/oauth/organisation/callback"}  # fmt: skip
    return OidcSettings(**{**base, **changes})


@pytest.fixture
def provider() -> Provider:
    return Provider()


def client_of(provider: Provider, clock: Any = time.time) -> OidcClient:
    return OidcClient(settings(), httpx.AsyncClient(transport=httpx.MockTransport(provider.handler)), clock=clock)


async def test_a_sign_in_starts_with_pkce_state_and_nonce_and_finishes_with_the_verified_user(
    provider: Provider,
) -> None:
    client = client_of(provider)
    begun = await client.start()
    query = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(begun.url).query))
    assert begun.url.startswith(f"{ISSUER}/auth?")
    assert query["code_challenge_method"] == "S256"
    digest = base64.urlsafe_b64encode(hashlib.sha256(begun.verifier.encode()).digest()).rstrip(b"=").decode()
    assert query["code_challenge"] == digest == challenge(begun.verifier)
    assert query["state"] == begun.state and query["nonce"] == begun.nonce and query["response_type"] == "code"
    assert query["redirect_uri"] == "https://chat.example.org/auth/oauth/organisation/callback"
    assert set(query["scope"].split()) == {"openid", "profile", "email"}
    provider.id_token = provider.token(nonce=begun.nonce)
    kept = {"state": begun.state, "nonce": begun.nonce, "verifier": begun.verifier}
    who = await client.finish("the-code", begun.state, kept)
    assert (who.name, who.email, who.email_verified, who.groups) == (
        "alice",
        "alice@example.org",
        True,
        ("chat-editors",),
    )
    assert provider.token_forms[-1]["code_verifier"] == begun.verifier  # PKCE: the verifier goes with the code
    assert provider.token_forms[-1]["code"] == "the-code"


async def test_a_wrong_state_is_refused_before_the_code_is_exchanged(provider: Provider) -> None:
    client = client_of(provider)
    begun = await client.start()
    with pytest.raises(SignInError) as caught:
        await client.finish("code", "another-state", {"state": begun.state, "nonce": begun.nonce, "verifier": "v"})
    assert caught.value.code == "sso.wrong_state"
    assert provider.token_forms == []


@pytest.mark.parametrize(
    ("what", "make", "reason"),
    [
        ("signed with another key", lambda p: p.token(key=_key()), "Signature"),
        ("another issuer", lambda p: p.token(iss="https://evil.example.org"), "another issuer"),
        ("another client", lambda p: p.token(aud="other-app"), "another client"),
        ("several audiences, no azp", lambda p: p.token(aud=[CLIENT, "other"]), "another client"),
        ("expired", lambda p: p.token(exp=time.time() - 120), "expired"),
        ("issued in the future", lambda p: p.token(iat=time.time() + 600), "future"),
        ("another nonce", lambda p: p.token(nonce="replayed"), "nonce"),
        ("no nonce", lambda p: p.token(nonce=None), "nonce"),
        ("no expiry", lambda p: p.token(exp=None), "exp"),
        ("HS256", lambda p: jwt.encode({"iss": ISSUER}, "a-shared-secret-of-32-bytes-long!", "HS256"), "HS256"),
        ("alg none", lambda p: jwt.encode({"iss": ISSUER, "sub": "x"}, None, algorithm="none"), "none"),
        ("a key the provider does not have", lambda p: p.token(kid="k9"), "no key"),
    ],
)
async def test_an_id_token_that_does_not_verify_is_refused(
    provider: Provider, what: str, make: Any, reason: str
) -> None:
    client = client_of(provider)
    with pytest.raises(SignInError) as caught:
        await client.verify(make(provider), "n-1")
    assert caught.value.code == "sso.bad_token", what
    assert reason in caught.value.message, (what, caught.value.message)


async def test_a_token_verified_a_while_after_it_expired_is_refused_by_the_clock(provider: Provider) -> None:
    now = [time.time()]
    client = client_of(provider, clock=lambda: now[0])
    token = provider.token()
    assert (await client.verify(token, "n-1"))["sub"] == "u-1"
    now[0] += 300 + 61  # past exp and the 60 s of skew
    with pytest.raises(SignInError, match="expired"):
        await client.verify(token, "n-1")


async def test_a_rotated_key_is_fetched_again_once(provider: Provider) -> None:
    client = client_of(provider)
    await client.verify(provider.token(), "n-1")
    assert provider.jwks_fetches == 1
    provider.key, provider.kid = _key(), "k2"  # the provider rotates its key
    assert (await client.verify(provider.token(), "n-1"))["sub"] == "u-1"
    assert provider.jwks_fetches == 2


async def test_a_provider_calling_itself_by_another_name_is_not_trusted() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"issuer": "https://evil.example.org", "authorization_endpoint": "x"})

    client = OidcClient(settings(), httpx.AsyncClient(transport=httpx.MockTransport(handler)))
    with pytest.raises(SignInError) as caught:
        await client.start()
    assert caught.value.code == "sso.unreachable"


def test_the_sealed_state_cannot_be_altered_or_kept_too_long() -> None:
    sealed = seal({"state": "s", "nonce": "n"}, "secret-1")
    assert unseal(sealed, "secret-1")["state"] == "s"
    _, mac = sealed.rsplit(".", 1)
    forged = base64.urlsafe_b64encode(json.dumps({"state": "x", "at": time.time()}).encode()).rstrip(b"=").decode()
    for bad in (None, "", "no-dot", f"{forged}.{mac}", sealed + "x"):
        with pytest.raises(SignInError):
            unseal(bad, "secret-1")
    with pytest.raises(SignInError):
        unseal(sealed, "another-secret")
    with pytest.raises(SignInError):
        unseal(sealed, "secret-1", clock=lambda: time.time() + 601)


def test_groups_give_the_highest_role_they_map_to_or_the_default() -> None:
    roles = {"chat-users": "user", "chat-editors": "editor", "chat-admins": "admin"}
    assert role_for(["chat-users", "chat-admins", "chat-editors"], roles, None) == "admin"
    assert role_for(["chat-users", "other"], roles, None) == "user"
    assert role_for(["other"], roles, None) is None
    assert role_for([], roles, "user") == "user"
    assert groups_of("a, b,,c") == ("a", "b", "c") and groups_of(["a", 2]) == ("a", "2") and groups_of(None) == ()


def test_the_user_name_comes_from_the_name_claim_or_the_email_and_must_be_usable() -> None:
    who = identity_of(ISSUER, {"sub": "1", "preferred_username": "bo", "groups": "g"}, "preferred_username", "groups")
    assert (who.name, who.email, who.email_verified, who.groups) == ("bo", None, False, ("g",))
    assert identity_of(ISSUER, {"sub": "1", "email": "c@x.org"}, "preferred_username", "groups").name == "c@x.org"
    with pytest.raises(SignInError) as caught:
        identity_of(ISSUER, {"sub": "1"}, "preferred_username", "groups")
    assert caught.value.code == "sso.no_name"
    with pytest.raises(SignInError) as caught:
        identity_of(ISSUER, {"sub": "1", "preferred_username": "a b/../"}, "preferred_username", "groups")
    assert caught.value.code == "sso.bad_name"


def test_an_enabled_provider_needs_its_issuer_client_secret_and_a_fixed_callback() -> None:
    with pytest.raises(ValueError, match="client_secret"):
        OidcSettings(
            enabled=True, issuer=ISSUER, client_id=CLIENT, redirect_uri="https://c/auth/oauth/organisation/callback"
        )
    with pytest.raises(ValueError, match="redirect_uri"):
        settings(redirect_uri="https://chat.example.org/elsewhere")
    with pytest.raises(ValueError, match="openid"):
        settings(scopes=["profile"])


def test_a_configuration_where_nobody_could_sign_in_is_refused() -> None:
    from backend.config import AuthSettings

    with pytest.raises(ValueError, match="nobody could sign in"):
        AuthSettings(enabled=True, password=False)
    with pytest.raises(ValueError, match=r"need auth\.enabled"):
        AuthSettings(enabled=False, oidc=settings())
    assert AuthSettings(enabled=True, password=False, oidc=settings()).oidc.enabled
