"""A real OpenID Connect provider for the tests: Django with django-oauth-toolkit (tests/oidc_provider,
requirements-dev.txt) in a process of its own, served by waitress on a free port of 127.0.0.1.

Its issuer is http://localhost:PORT/o: the app under test runs on 127.0.0.1, so a browser keeps the two sites' cookies
apart (the provider's are provider_session and provider_csrf anyway). Discovery at {issuer}/.well-known/openid-
configuration; endpoints {issuer}/authorize/, /token/, /userinfo/, /.well-known/jwks.json, /logout/ (RP-initiated
logout); the sign-in page http://localhost:PORT/accounts/login/ (fields id_username, id_password, button "Sign in").
One confidential client (authorization-code grant, PKCE with S256 required, consent skipped: after the sign-in the
browser goes straight back to the redirect URI). ID tokens are RS256, with `iss`, `aud` (the client id), `nonce`,
`sub` (the user's id in the provider, stable), `groups` (sorted names), and with the profile and email scopes
`preferred_username`, `name`, `email`, `email_verified` (true). The same claims come from userinfo.

In a test module (the `oidc_provider` fixture of tests/conftest.py, one provider per module):

    @pytest.mark.parametrize("oidc_provider", [["http://127.0.0.1:8501/auth/oauth/oidc/callback"]], indirect=True)
    def test_sign_in(oidc_provider: OidcProvider) -> None:
        oidc_provider.set_user("alice", "pw", "alice@example.test", ["chat-editors"])
        ... oidc_provider.issuer, .client_id, .client_secret ...

or without parameters, and the redirect URIs set once the app's port is known: `oidc_provider.set_redirect_uris([...])`.
Outside pytest's fixtures: `with oidc_provider_running(folder, [uri]) as provider: ...`."""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from backend.serving.process import free_port, guarded
from tests.waiting import TAIL_CHARS, wait_alive

ROOT = Path(__file__).resolve().parent.parent
START_TIMEOUT_S = 60.0  # ~3 s on a quiet machine with 2 cores (migrating a new database is most of it)
STOP_TIMEOUT_S = 10.0
ADMIN_TIMEOUT_S = 60.0
DEFAULT_CLIENT_ID = "ernie-chat"


class OidcProvider:
    """One provider process: its issuer, its client's id and secret, its port and data folder (database, signing key,
    log). `start()` waits until discovery answers; `stop()` ends it (SIGTERM, then SIGKILL)."""

    def __init__(
        self,
        data: Path,
        redirect_uris: Sequence[str] = (),
        *,
        client_id: str = DEFAULT_CLIENT_ID,
        client_secret: str | None = None,
        post_logout_redirect_uris: Sequence[str] = (),
        id_token_s: int = 300,
        port: int | None = None,
    ) -> None:
        self.data = Path(data)
        self.redirect_uris = list(redirect_uris)
        self.post_logout_redirect_uris = list(post_logout_redirect_uris)
        self.client_id = client_id
        self.client_secret = client_secret or secrets.token_urlsafe(24)
        self.id_token_s = id_token_s
        self._use_port(port or free_port())
        self.log = self.data / "provider.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def _use_port(self, port: int) -> None:
        self.port = port
        self.base_url = f"http://localhost:{port}"
        self.issuer = f"{self.base_url}/o"
        self.discovery_url = f"{self.issuer}/.well-known/openid-configuration"
        self.login_url = f"{self.base_url}/accounts/login/"

    def start(self, timeout: float = START_TIMEOUT_S) -> None:
        """Start the server and wait until its discovery document names this issuer; fails with the log's tail.

        A port taken between free_port() and the server's bind is replaced by another (twice at most)."""
        for attempt in range(3):
            logged = len(self.log_text())
            try:
                return self._start(timeout)
            except AssertionError:
                if attempt == 2 or "Address already in use" not in self.log_text()[logged:]:
                    raise
                self._use_port(free_port())

    def _start(self, timeout: float) -> None:
        self.data.mkdir(parents=True, exist_ok=True)
        argv = [sys.executable, "-m", "tests.oidc_provider", "serve", "--data", str(self.data)]
        argv += ["--port", str(self.port), "--issuer", self.issuer, "--client-id", self.client_id]
        argv += ["--id-token-s", str(self.id_token_s)]
        for uri in self.redirect_uris:
            argv += ["--redirect-uri", uri]
        for uri in self.post_logout_redirect_uris:
            argv += ["--post-logout-redirect-uri", uri]
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                guarded(argv),  # SIGTERM if the test process dies
                cwd=ROOT,
                env=self._env(TEST_OIDC_CLIENT_SECRET=self.client_secret),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            wait_alive(self.proc, self._answers, "the OpenID provider", self.log_text, timeout, 0.1)
        except BaseException:
            self.stop()
            raise

    def _env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "TEST_OIDC_"))}
        return {**env, "PYTHONUNBUFFERED": "1", **extra}

    def _answers(self) -> bool:
        try:
            return self.discovery().get("issuer") == self.issuer
        except (OSError, ValueError):
            return False

    def discovery(self) -> dict:
        """The discovery document (raises OSError while the server does not answer)."""
        with urllib.request.urlopen(self.discovery_url, timeout=5) as resp:
            return dict(json.loads(resp.read()))

    def admin(self, *args: str) -> str:
        """Run an admin command of `python -m tests.oidc_provider` on this provider's database; its output."""
        command, *rest = args
        argv = [sys.executable, "-m", "tests.oidc_provider", command, "--data", str(self.data), *rest]
        done = subprocess.run(
            argv, cwd=ROOT, env=self._env(), capture_output=True, text=True, timeout=ADMIN_TIMEOUT_S, check=False
        )
        if done.returncode != 0:
            raise AssertionError(f"{' '.join(args)} failed ({done.returncode}):\n{done.stderr[-TAIL_CHARS:]}")
        return done.stdout

    def set_user(
        self,
        name: str,
        password: str,
        email: str | None = None,
        groups: Iterable[str] = (),
        full_name: str | None = None,
    ) -> None:
        """Create or change a user: password, e-mail (default NAME@example.test), groups (replaced), full name."""
        # --option=value: a value may begin with "-" (secrets.token_urlsafe does, 1 time in 32), which argparse would
        # take for an option of its own
        args = ["users", "set", name, f"--password={password}", f"--groups={','.join(groups)}"]
        if email is not None:
            args.append(f"--email={email}")
        if full_name is not None:
            args.append(f"--full-name={full_name}")
        self.admin(*args)

    def set_groups(self, name: str, groups: Iterable[str]) -> None:
        """Replace a user's groups (the next sign-in's token carries them)."""
        self.admin("users", "set-groups", name, ",".join(groups))

    def users(self) -> list[dict]:
        """Every user: sub, username, email, name, groups."""
        return list(json.loads(self.admin("users", "list")))

    def set_redirect_uris(self, uris: Sequence[str]) -> None:
        """Replace the client's redirect URIs (effective at the next request; no restart)."""
        self.admin("client", "set-redirect-uris", "--client-id", self.client_id, *uris)
        self.redirect_uris = list(uris)

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def log_tail(self, chars: int = TAIL_CHARS) -> str:
        """The end of the server's log, for a failing test's message."""
        return self.log_text()[-chars:]

    def stop(self) -> None:
        """SIGTERM, then SIGKILL of its process group after STOP_TIMEOUT_S; the data folder stays."""
        proc = self.proc
        if proc is None:
            return
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


@contextmanager
def oidc_provider_running(data: Path, redirect_uris: Sequence[str] = (), **options: Any) -> Iterator[OidcProvider]:
    """A provider started and answering for the `with` block, its data in `data` (`options`: OidcProvider's
    client_id, client_secret, post_logout_redirect_uris, id_token_s, port), stopped at its end whatever happens."""
    provider = OidcProvider(data, redirect_uris, **options)
    provider.start()
    try:
        yield provider
    finally:
        provider.stop()
