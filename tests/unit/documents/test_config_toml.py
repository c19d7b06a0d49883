"""Chainlit's page offers what the library takes: .chainlit/config.toml's upload settings are the app's defaults."""

from __future__ import annotations

import tomllib

from backend.config import ROOT, DocumentSettings
from backend.documents.extract import accepted_types


def test_chainlit_upload_settings_match_the_library() -> None:
    upload = tomllib.loads((ROOT / ".chainlit" / "config.toml").read_text())["features"]["spontaneous_file_upload"]
    defaults = DocumentSettings()
    assert upload["enabled"] is True
    assert upload["max_size_mb"] == defaults.max_file_mb
    assert upload["accept"] == accepted_types()
    assert upload["max_files"] == min(defaults.max_documents, 10)
