"""Sign-in with the organisation's OpenID Connect provider (auth.oidc): the protocol, nothing of the web framework.

The authorization code flow with PKCE (S256), `state` and `nonce`, as OpenID Connect Core 1.0 and RFC 9700 ask:
- `start()` makes a fresh state, nonce and code verifier and the provider's authorization URL; the caller keeps the
  three secrets in a sealed cookie (`seal`/`unseal`, HMAC with the login session secret) until the browser returns;
- `finish()` checks the returned state, exchanges the code (with the verifier and the client secret) at the token
  endpoint, and verifies the ID token: signature against the provider's published keys (JWKS, fetched again once
  when a key id is unknown: the provider rotated), an asymmetric algorithm only (never "none" or a shared-secret
  one), issuer, audience (and azp when there are several), expiry and issue time (60 s of clock skew), nonce.
The claims then give the user's name, email and groups; `role_for` maps the groups to a role (auth.oidc.roles).
Discovery ({issuer}/.well-known/openid-configuration) is read once and kept for an hour.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import secrets
import time
import urllib.parse
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import httpx
import jwt

from backend.accounts.users import ROLES, name_problem
from backend.config import OidcSettings
from backend.errors import SignInError

log = logging.getLogger(__name__)

ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA")
LEEWAY_S = 60  # clock skew allowed between this machine and the provider
DISCOVERY_S = 3600  # how long the provider's metadata is kept
START_S = 600  # how long a sign-in may take at the provider (the sealed cookie's life)


@dataclass(frozen=True)
class Start:
    """A sign-in on its way to the provider: where to send the browser, and the secrets to keep until it returns."""

    url: str
    state: str
    nonce: str
    verifier: str


@dataclass(frozen=True)
class Identity:
    """Who the provider (or a sign-in proxy) says signed in."""

    issuer: str
    subject: str
    name: str
    email: str | None
    email_verified: bool
    groups: tuple[str, ...]


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def challenge(verifier: str) -> str:
    """PKCE's S256 code challenge of `verifier` (RFC 7636)."""
    return _b64(hashlib.sha256(verifier.encode("ascii")).digest())


def seal(data: Mapping[str, Any], secret: str, clock: Callable[[], float] = time.time) -> str:
    """`data` as a cookie value only this app can have made (HMAC-SHA256 with `secret`), stamped with its time."""
    body = _b64(json.dumps({**data, "at": clock()}, separators=(",", ":")).encode())
    mac = _b64(hmac.new(secret.encode(), body.encode(), hashlib.sha256).digest())
    return f"{body}.{mac}"


def unseal(value: str | None, secret: str, max_age_s: float = START_S, clock: Callable[[], float] = time.time) -> dict:
    """The data sealed in `value`, or SignInError when it is missing, altered or older than max_age_s."""
    if not value or "." not in value:
        raise SignInError.of("sso.no_state")
    body, mac = value.rsplit(".", 1)
    expected = _b64(hmac.new(secret.encode(), body.encode(), hashlib.sha256).digest())
    if not hmac.compare_digest(mac, expected):
        raise SignInError.of("sso.no_state")
    data = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    if not isinstance(data, dict) or clock() - float(data.get("at", 0)) > max_age_s:
        raise SignInError.of("sso.no_state")
    return data


def role_for(groups: Iterable[str], roles: Mapping[str, str], default: str | None) -> str | None:
    """The highest role (users.ROLES order) that `roles` gives one of `groups`; `default` when none maps."""
    found = [roles[g] for g in groups if g in roles]
    return max(found, key=ROLES.index) if found else default


def groups_of(value: object) -> tuple[str, ...]:
    """A groups claim as names: a list, one name, or a comma-separated text (a proxy's header)."""
    if isinstance(value, str):
        return tuple(g.strip() for g in value.split(",") if g.strip())
    if isinstance(value, list | tuple):
        return tuple(str(g) for g in value)
    return ()


def identity_of(issuer: str, claims: Mapping[str, Any], name_claim: str, roles_claim: str) -> Identity:
    """The user the verified `claims` describe; SignInError when they name no usable user name."""
    email = claims.get("email") if isinstance(claims.get("email"), str) else None
    name = claims.get(name_claim) or email
    if not isinstance(name, str) or not name:
        raise SignInError.of("sso.no_name", claim=name_claim)
    if name_problem(name):
        raise SignInError.of("sso.bad_name", name=name[:80])
    verified = claims.get("email_verified") in (True, "true")
    return Identity(issuer, str(claims["sub"]), name, email, verified, groups_of(claims.get(roles_claim)))


class OidcClient:
    """The app's side of the provider: discovery, the authorization URL, the code exchange, the ID token's checks."""

    def __init__(
        self, settings: OidcSettings, http: httpx.AsyncClient | None = None, clock: Callable[[], float] = time.time
    ) -> None:
        assert settings.issuer and settings.client_id and settings.redirect_uri and settings.client_secret
        self.settings = settings
        self.issuer = settings.issuer.rstrip("/")
        self.client_id = settings.client_id
        self.redirect_uri = settings.redirect_uri
        self.http = http or httpx.AsyncClient(timeout=settings.timeout_s, follow_redirects=False)
        self.clock = clock
        self._metadata: dict[str, Any] | None = None
        self._metadata_at = 0.0
        self._keys: dict[str, Any] = {}

    async def _get_json(self, url: str) -> dict[str, Any]:
        try:
            answer = await self.http.get(url, headers={"Accept": "application/json"})
            answer.raise_for_status()
            data = answer.json()
        except (httpx.HTTPError, ValueError) as exc:
            log.error("OpenID provider not reachable at %s: %s", url, exc)
            raise SignInError.of("sso.unreachable", issuer=self.issuer) from exc
        if not isinstance(data, dict):
            raise SignInError.of("sso.unreachable", issuer=self.issuer)
        return data

    async def metadata(self) -> dict[str, Any]:
        """The provider's discovery document (kept DISCOVERY_S); its issuer must be the configured one."""
        if self._metadata is None or self.clock() - self._metadata_at > DISCOVERY_S:
            found = await self._get_json(f"{self.issuer}/.well-known/openid-configuration")
            if str(found.get("issuer", "")).rstrip("/") != self.issuer:
                log.error(
                    "The provider at %s calls itself %r: check auth.oidc.issuer.", self.issuer, found.get("issuer")
                )
                raise SignInError.of("sso.unreachable", issuer=self.issuer)
            self._metadata, self._metadata_at = found, self.clock()
        return self._metadata

    async def start(self) -> Start:
        """A new sign-in: the authorization URL (code flow, PKCE S256) and the state, nonce and verifier to keep."""
        meta = await self.metadata()
        state, nonce, verifier = secrets.token_urlsafe(24), secrets.token_urlsafe(24), secrets.token_urlsafe(48)
        query = {
            "response_type": "code",
            "client_id": self.client_id,
            "redirect_uri": self.redirect_uri,
            "scope": " ".join(self.settings.scopes),
            "state": state,
            "nonce": nonce,
            "code_challenge": challenge(verifier),
            "code_challenge_method": "S256",
        }
        endpoint = str(meta["authorization_endpoint"])
        sep = "&" if "?" in endpoint else "?"
        return Start(f"{endpoint}{sep}{urllib.parse.urlencode(query)}", state, nonce, verifier)

    async def finish(self, code: str, returned_state: str, kept: Mapping[str, Any]) -> Identity:
        """Check the state, exchange the code, verify the ID token; the user it names (SignInError otherwise)."""
        if not hmac.compare_digest(str(kept.get("state", "")), returned_state):
            raise SignInError.of("sso.wrong_state")
        meta = await self.metadata()
        secret = self.settings.client_secret
        assert secret is not None
        form = {
            "grant_type": "authorization_code",
            "code": code,
            "redirect_uri": self.redirect_uri,
            "code_verifier": str(kept.get("verifier", "")),
        }
        methods = meta.get("token_endpoint_auth_methods_supported") or ["client_secret_basic"]
        auth: httpx.BasicAuth | httpx._client.UseClientDefault = httpx.USE_CLIENT_DEFAULT
        if "client_secret_basic" in methods:  # RFC 6749 2.3.1: both form-encoded before the Basic scheme
            user, password = self.client_id, secret.get_secret_value()
            auth = httpx.BasicAuth(urllib.parse.quote(user, safe=""), urllib.parse.quote(password, safe=""))
        else:
            form |= {"client_id": self.client_id, "client_secret": secret.get_secret_value()}
        try:
            answer = await self.http.post(str(meta["token_endpoint"]), data=form, auth=auth)
        except httpx.HTTPError as exc:
            log.error("OpenID provider's token endpoint not reachable: %s", exc)
            raise SignInError.of("sso.unreachable", issuer=self.issuer) from exc
        if answer.status_code != 200:
            log.warning("The provider refused the code: %s %s", answer.status_code, answer.text[:300])
            raise SignInError.of("sso.refused", reason=f"token endpoint answered {answer.status_code}")
        try:
            id_token = answer.json()["id_token"]
        except (ValueError, KeyError, TypeError) as exc:
            raise SignInError.of("sso.refused", reason="no ID token in the answer") from exc
        claims = await self.verify(str(id_token), str(kept.get("nonce", "")))
        return identity_of(self.issuer, claims, self.settings.name_claim, self.settings.roles_claim)

    async def _key(self, kid: str | None, alg: str) -> Any:
        """The provider's public key `kid` for `alg` (the JWKS fetched again once when it is not known)."""
        for refresh in (False, True):
            if refresh or not self._keys:
                meta = await self.metadata()
                jwks = await self._get_json(str(meta["jwks_uri"]))
                keys: dict[str, Any] = {}
                for entry in jwks.get("keys", []):
                    try:
                        keys[str(entry.get("kid", ""))] = jwt.PyJWK(entry)
                    except (jwt.PyJWKError, jwt.InvalidKeyError):
                        continue  # a key of a kind this app does not use (an encryption key, say)
                self._keys = keys
            candidates = [k for i, k in self._keys.items() if kid is None or i == kid]
            if kid is None and len(candidates) != 1:
                candidates = [k for k in candidates if k.algorithm_name == alg]
            if candidates:
                return candidates[0].key
        raise SignInError.of("sso.bad_token", reason=f"no key {kid!r} at the provider")

    async def verify(self, id_token: str, nonce: str | None) -> dict[str, Any]:
        """The ID token's claims once its signature, issuer, audience, times and nonce are right; else SignInError."""
        try:
            header = jwt.get_unverified_header(id_token)
        except jwt.PyJWTError as exc:
            raise SignInError.of("sso.bad_token", reason="not a signed token") from exc
        alg = header.get("alg")
        if alg not in ALGORITHMS:
            raise SignInError.of("sso.bad_token", reason=f"algorithm {alg!r} not accepted")
        key = await self._key(header.get("kid"), alg)
        try:
            claims = jwt.decode(
                id_token,
                key=key,
                algorithms=[alg],
                audience=self.client_id,
                issuer=self.issuer,
                options={
                    "verify_exp": False,
                    "verify_iat": False,
                    "verify_nbf": False,
                    "require": ["iss", "sub", "aud", "exp", "iat"],
                },
            )
        except jwt.InvalidIssuerError as exc:
            raise SignInError.of("sso.bad_token", reason="another issuer") from exc
        except jwt.InvalidAudienceError as exc:
            raise SignInError.of("sso.bad_token", reason="made for another client") from exc
        except jwt.PyJWTError as exc:
            raise SignInError.of("sso.bad_token", reason=str(exc)[:120]) from exc
        now = self.clock()
        if float(claims["exp"]) < now - LEEWAY_S:
            raise SignInError.of("sso.bad_token", reason="expired")
        if float(claims["iat"]) > now + LEEWAY_S or float(claims.get("nbf", 0)) > now + LEEWAY_S:
            raise SignInError.of("sso.bad_token", reason="issued in the future")
        audiences = claims["aud"] if isinstance(claims["aud"], list) else [claims["aud"]]
        if len(audiences) > 1 and claims.get("azp") != self.client_id:
            raise SignInError.of("sso.bad_token", reason="made for another client")
        if nonce is not None and not hmac.compare_digest(str(claims.get("nonce", "")), nonce):
            raise SignInError.of("sso.bad_token", reason="wrong nonce (replayed)")
        return claims

    async def close(self) -> None:
        await self.http.aclose()
