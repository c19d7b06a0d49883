"""The claims the provider gives (ID token and userinfo), and its quick password hasher."""

from __future__ import annotations

from typing import Any, ClassVar

from django.contrib.auth.hashers import PBKDF2PasswordHasher
from oauth2_provider.oauth2_validators import OAuth2Validator


class ClaimsValidator(OAuth2Validator):
    """django-oauth-toolkit's validator with the claims an app's sign-in reads.

    openid: `sub` (the user's database id, stable for the user) and `groups` (the names of the user's Django groups,
    sorted; with openid so that the ID token itself carries them); profile: `preferred_username` (the user name),
    `name` (the full name, else the user name); email: `email`, `email_verified` (always true)."""

    oidc_claim_scope: ClassVar[dict[str, str]] = {**OAuth2Validator.oidc_claim_scope, "groups": "openid"}

    # The request-agnostic form (no request argument): discovery's claims_supported lists these claims too.
    def get_additional_claims(self) -> dict[str, Any]:
        return {
            "preferred_username": lambda request: request.user.get_username(),
            "name": lambda request: request.user.get_full_name() or request.user.get_username(),
            "email": lambda request: request.user.email,
            "email_verified": lambda request: True,
            "groups": lambda request: sorted(request.user.groups.values_list("name", flat=True)),
        }


class QuickPBKDF2PasswordHasher(PBKDF2PasswordHasher):
    """PBKDF2-SHA256 with 1,000 rounds: for the test provider's throwaway accounts and client secrets only."""

    iterations = 1000
