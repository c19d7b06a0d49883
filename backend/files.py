"""Files that several processes on one machine share (two app processes started together, the tune and a running
app, two test processes): each is written whole (a reader sees the old file or the new one, never a part), and what
takes long to make is made by one process at a time (an advisory lock beside it, released when its holder ends,
however it ends)."""

from __future__ import annotations

import fcntl
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def atomic_write(path: Path, text: str, mode: int = 0o644) -> None:
    """Write `text` to `path` so that readers see the old file or the new one, never a part of it.

    The temporary file has a name of its own (writers never share one), starts with "." (the template store skips
    such names) and lives in the same folder, so os.replace is a rename on one file system."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@contextmanager
def one_at_a_time(lock: Path) -> Iterator[None]:
    """Hold the lock file `lock` (made if missing) until the block ends; another holder is waited for."""
    lock.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock
