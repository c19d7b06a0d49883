"""The chat page as served: Chainlit's own page, less what it would load from other hosts."""

from __future__ import annotations

import re

from chainlit.server import get_html_template

from backend.web.page import self_contained

OTHER_HOST = re.compile(r"""(?:href|src)=["'](?:https?:)?//""", re.IGNORECASE)


def test_chainlits_page_loses_its_links_to_other_hosts_and_keeps_its_own() -> None:
    original = get_html_template("")
    assert OTHER_HOST.search(original), "Chainlit 2.12's page links cdn.jsdelivr.net and Google Fonts"
    page = self_contained(original)
    assert not OTHER_HOST.search(page), page
    assert 'src="/assets/' in page and 'href="/assets/' in page, "its own script and stylesheet stay"
    assert page.count("<link") == original.count("<link") - len(OTHER_HOST.findall(original))


def test_a_local_link_is_kept() -> None:
    html = '<link rel="stylesheet" href="/public/ernie.css"><link rel="preconnect" href="//fonts.example" />'
    assert self_contained(html) == '<link rel="stylesheet" href="/public/ernie.css">'
