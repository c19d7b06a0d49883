"""Command line of the tests' OpenID provider: `serve`, and the admin commands `users` and `client` (see __init__)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

CLIENT_NAME = "the app under test"


def _setup(data: Path, issuer: str = "", id_token_s: int = 300) -> None:
    """Django configured for the data folder (the TEST_OIDC_* variables settings.py reads) and its database migrated."""
    os.environ["TEST_OIDC_DATA"] = str(data)
    os.environ["TEST_OIDC_ISSUER"] = issuer
    os.environ["TEST_OIDC_ID_TOKEN_S"] = str(id_token_s)
    os.environ["DJANGO_SETTINGS_MODULE"] = "tests.oidc_provider.settings"
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", interactive=False, verbosity=0)


def _groups(text: str) -> list[str]:
    return [name.strip() for name in text.split(",") if name.strip()]


def serve(args: argparse.Namespace) -> None:
    started = time.monotonic()
    _setup(args.data, args.issuer.rstrip("/"), args.id_token_s)
    from oauth2_provider.models import get_application_model

    secret = args.client_secret or os.environ.get("TEST_OIDC_CLIENT_SECRET", "")
    if not secret:
        sys.exit("serve: --client-secret or TEST_OIDC_CLIENT_SECRET is needed")
    application_model = get_application_model()
    application_model.objects.update_or_create(
        client_id=args.client_id,
        defaults={
            "name": CLIENT_NAME,
            "client_secret": secret,  # hashed as it is saved
            "client_type": application_model.CLIENT_CONFIDENTIAL,
            "authorization_grant_type": application_model.GRANT_AUTHORIZATION_CODE,
            "redirect_uris": " ".join(args.redirect_uri),
            "post_logout_redirect_uris": " ".join(args.post_logout_redirect_uri),
            "algorithm": application_model.RS256_ALGORITHM,
            "skip_authorization": True,
        },
    )
    from django.core.wsgi import get_wsgi_application
    from waitress import serve as waitress_serve

    application = get_wsgi_application()
    print(
        f"test OpenID provider: issuer {args.issuer} on 127.0.0.1:{args.port}, client {args.client_id}, "
        f"ready in {time.monotonic() - started:.1f} s",
        flush=True,
    )
    logging.getLogger("waitress").setLevel(logging.WARNING)
    waitress_serve(application, host="127.0.0.1", port=args.port, threads=8, ident="test-oidc-provider")


def users(args: argparse.Namespace) -> None:
    _setup(args.data)
    from django.contrib.auth.models import Group, User
    from django.db import transaction

    def set_groups(user: Any, names: Sequence[str]) -> None:
        user.groups.set([Group.objects.get_or_create(name=name)[0] for name in names])

    with transaction.atomic():
        if args.action == "set":
            user, _ = User.objects.get_or_create(username=args.name)
            if args.password is not None:
                user.set_password(args.password)
            elif not user.has_usable_password():
                user.set_unusable_password()
            user.email = args.email if args.email is not None else (user.email or f"{args.name}@example.test")
            if args.full_name is not None:
                user.first_name, user.last_name = args.full_name, ""
            user.save()
            if args.groups is not None:
                set_groups(user, _groups(args.groups))
        elif args.action == "set-groups":
            set_groups(User.objects.get(username=args.name), _groups(args.groups))
        elif args.action == "delete":
            User.objects.filter(username=args.name).delete()
        elif args.action == "list":
            listed = [
                {
                    "sub": str(user.pk),
                    "username": user.username,
                    "email": user.email,
                    "name": user.get_full_name(),
                    "groups": sorted(user.groups.values_list("name", flat=True)),
                }
                for user in User.objects.order_by("username")
            ]
            print(json.dumps(listed, indent=1))


def client(args: argparse.Namespace) -> None:
    _setup(args.data)
    from oauth2_provider.models import get_application_model

    application_model = get_application_model()
    changed = application_model.objects.filter(client_id=args.client_id).update(redirect_uris=" ".join(args.uris))
    if not changed:
        sys.exit(f"client: no client {args.client_id!r} (serve registers it)")


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="python -m tests.oidc_provider", description=__doc__)
    commands = top.add_subparsers(dest="command", required=True)

    run = commands.add_parser("serve", help="serve the provider on 127.0.0.1 (waitress)")
    run.add_argument("--data", type=Path, required=True, help="the data folder (database, keys)")
    run.add_argument("--port", type=int, required=True)
    run.add_argument("--issuer", required=True, help="e.g. http://localhost:PORT/o (its host and scheme: endpoints)")
    run.add_argument("--client-id", required=True)
    run.add_argument("--client-secret", default="", help="default: the TEST_OIDC_CLIENT_SECRET variable")
    run.add_argument("--redirect-uri", action="append", default=[], help="the client's redirect URI (repeatable)")
    run.add_argument("--post-logout-redirect-uri", action="append", default=[], help="(repeatable)")
    run.add_argument("--id-token-s", type=int, default=300, help="ID token lifetime in seconds (default 300)")
    run.set_defaults(handler=serve)

    people = commands.add_parser("users", help="add or change users and their groups")
    people.add_argument("--data", type=Path, required=True)
    actions = people.add_subparsers(dest="action", required=True)
    put = actions.add_parser("set", help="create or change a user")
    put.add_argument("name")
    put.add_argument("--password", help="a new user without one cannot sign in")
    put.add_argument("--email", help="default: kept, or NAME@example.test for a new user")
    put.add_argument("--full-name", help="the `name` claim (default: the user name)")
    put.add_argument("--groups", help="comma-separated group names, replacing the user's (default: kept)")
    regroup = actions.add_parser("set-groups", help="replace a user's groups")
    regroup.add_argument("name")
    regroup.add_argument("groups", help='comma-separated group names ("" for none)')
    actions.add_parser("delete", help="delete a user").add_argument("name")
    actions.add_parser("list", help="the users as JSON")
    people.set_defaults(handler=users)

    app = commands.add_parser("client", help="change the registered client")
    app.add_argument("--data", type=Path, required=True)
    app_actions = app.add_subparsers(dest="action", required=True)
    uris = app_actions.add_parser("set-redirect-uris", help="replace the client's redirect URIs")
    uris.add_argument("uris", nargs="+")
    uris.add_argument("--client-id", required=True)
    app.set_defaults(handler=client)
    return top


def main(argv: Sequence[str] | None = None) -> None:
    args = parser().parse_args(argv)
    args.handler(args)


if __name__ == "__main__":
    main()
