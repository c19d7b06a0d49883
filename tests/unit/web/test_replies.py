"""Whose a page's live replies are (backend.web.replies.owner_of), the key backend.chat.live finds a reply by: with
login its user, on every page of theirs and on no page of another's; without login the browser tab."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from backend.web.replies import TAB_COOKIE, owner_of

TAB = "0123456789abcdef0123"


def page(session_id: str, user: str | None = None, tab: str | None = None) -> Any:
    """A Chainlit session as owner_of reads it: its id, its user, its cookies."""
    cookie = f"{TAB_COOKIE}={tab}" if tab else ""
    return SimpleNamespace(
        id=session_id, user=SimpleNamespace(identifier=user) if user else None, environ={"HTTP_COOKIE": cookie}
    )


def test_with_login_a_reply_is_its_users_on_every_page_and_nobody_elses() -> None:
    alice, alice_again, bob = page("s1", "alice", TAB), page("s2", "alice"), page("s3", "bob", TAB)
    assert owner_of(alice, login=True) == owner_of(alice_again, login=True) == "user:alice"
    assert owner_of(bob, login=True) == "user:bob", "the same browser tab does not make bob alice"


def test_without_login_a_reply_is_the_browser_tabs() -> None:
    assert owner_of(page("s1", tab=TAB), login=False) == owner_of(page("s2", tab=TAB), login=False) == f"tab:{TAB}"
    assert owner_of(page("s1", "alice", TAB), login=False) == f"tab:{TAB}", "a name without login proves nothing"
    assert owner_of(page("s3"), login=False) == "session:s3", "a page without the tab's id: only itself"
    assert owner_of(page("s3", tab="short"), login=False) == "session:s3", "an id that is no tab's"
