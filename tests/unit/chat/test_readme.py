"""The Readme panel: Chainlit serves each language of the page a file of its own, never its fallback to chainlit.md
(which it announces with a warning on its logger)."""

from __future__ import annotations

import logging

import pytest
from chainlit.markdown import get_markdown_str

from backend.config import ROOT


def chainlit_warnings(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "chainlit" and r.levelno >= logging.WARNING]


@pytest.mark.parametrize("locale", ["en-US", "zh-CN"])
def test_each_language_of_the_page_has_a_readme_of_its_own(locale: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="chainlit")
    assert get_markdown_str(str(ROOT), locale) == (ROOT / f"chainlit_{locale}.md").read_text(encoding="utf-8")
    assert chainlit_warnings(caplog) == [], "no fallback to chainlit.md"


def test_a_language_without_a_readme_falls_back_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    """What the test above would see if a file were missing: the check of the logger's records can fail."""
    caplog.set_level(logging.WARNING, logger="chainlit")
    assert not (ROOT / "chainlit_fr-FR.md").exists()
    assert get_markdown_str(str(ROOT), "fr-FR") == (ROOT / "chainlit.md").read_text(encoding="utf-8")
    assert [r.levelno for r in chainlit_warnings(caplog)] == [logging.WARNING]
