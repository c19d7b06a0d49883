"""Who may use the workshop: with login on, users whose role is editor or admin; without login, the machine the app
runs on (unless workshop.allow_remote). Everyone else is refused by the API itself (403), not only by the page.

"This machine" (local_request, the API's rule too) is a loopback client asking for a loopback address (Host), so a
name that an attacker points at 127.0.0.1 (DNS rebinding) does not pass. Requests made by another site's page (a
foreign Origin) never get this far: backend.web.guard refuses them for every route. A TCP forwarder on this machine
(ssh -L, socat) makes its clients local: docs/security.md."""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

from fastapi import Request

from backend.accounts.login import Accounts
from backend.accounts.users import EDITOR_ROLES
from backend.config import AppConfig
from backend.errors import WorkshopError

Identify = Callable[[Request], str | None]


@dataclass(frozen=True)
class Editor:
    """Who makes a change, as the history records it: a user name, or where the request came from."""

    name: str
    role: str | None = None


def no_login(request: Request) -> str | None:
    """Whose login a request carries, where none is read (the app passes backend.web.login.login_user)."""
    return None


def is_local(host: str | None) -> bool:
    """Whether a client address is this machine (127.0.0.0/8, ::1, or IPv4 loopback written as IPv6)."""
    try:
        address = ipaddress.ip_address(host or "")
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback


def host_name(host_header: str | None) -> str:
    """The host of a Host header without its port ("[::1]:8501" -> "::1", "localhost:8501" -> "localhost")."""
    return urlsplit("//" + (host_header or "")).hostname or ""


def local_request(request: Request) -> bool:
    """From this machine, asking for a loopback address (a DNS-rebound name does not pass)."""
    host = request.client.host if request.client else None
    asked = host_name(request.headers.get("host"))
    return is_local(host) and (asked == "localhost" or is_local(asked))


class Access:
    """Decides, for each request, whether it may use the workshop, and who it is."""

    def __init__(self, cfg: AppConfig, accounts: Accounts | None = None, identify: Identify = no_login) -> None:
        self.login = cfg.auth.enabled
        self.allow_remote = cfg.workshop.allow_remote
        self.accounts = accounts if accounts is not None or not self.login else Accounts.from_config(cfg)
        self.identify = identify

    def check(self, request: Request) -> Editor:
        """The editor making this request, or WorkshopError (the API answers it with 403)."""
        host = request.client.host if request.client else None
        if self.login:
            assert self.accounts is not None
            name = self.identify(request)
            if name is None:
                raise WorkshopError.of("workshop.login_needed")
            role = self.accounts.role(name)
            if role not in EDITOR_ROLES:
                raise WorkshopError.of("workshop.not_editor", name=name, role=role or "-")
            return Editor(name, role)
        if not self.allow_remote and not local_request(request):
            raise WorkshopError.of("workshop.remote", host=host or "?")
        return Editor("local" if is_local(host) else f"from {host}")
