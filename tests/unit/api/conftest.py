"""The API's database tests use the shared database's fixtures (tests/unit/storage/conftest.py)."""

from __future__ import annotations

from tests.unit.storage.conftest import db

__all__ = ["db"]
