"""An app's SQLite database opened by a test, and closed again.

`with sqlite3.connect(path) as db:` commits or rolls back at the end but leaves the connection open; Python 3.13
warns of it when the connection is collected (ResourceWarning, an error under the suite's `filterwarnings`), so on
Debian 13's Python the tests after such a block failed. tests/unit/test_python_range.py refuses the pattern."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def opened(path: Path | str) -> Iterator[sqlite3.Connection]:
    """The database at `path`: what the block does is committed (rolled back on an error), then it is closed."""
    db = sqlite3.connect(path)
    try:
        with db:
            yield db
    finally:
        db.close()
