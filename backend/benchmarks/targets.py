"""The server a benchmark measures: the engine started as the app starts it, or a server that already runs."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from backend.benchmarks.memory import metrics_rss_bytes, tree_rss_bytes
from backend.chat.client import ChatClient
from backend.chat.service import ChatService
from backend.config import AppConfig
from backend.engines.base import Endpoint, bearer
from backend.engines.registry import detect_api
from backend.errors import BenchmarkError

MemoryReader = Callable[[], Awaitable[int | None]]


@dataclass
class Server:
    """The server under test and how to reach and measure it."""

    kind: str  # managed | external
    engine: str
    endpoint: Endpoint
    client: ChatClient  # the app's own client, for the overhead runs
    memory: MemoryReader
    memory_source: str
    model_path: str | None = None
    flags: dict[str, Any] = field(default_factory=dict)
    service: ChatService | None = None


def _model_argument(argv: list[str]) -> str | None:
    return argv[argv.index("--model") + 1] if "--model" in argv else None


@contextlib.asynccontextmanager
async def managed_server(cfg: AppConfig) -> AsyncIterator[Server]:
    """Start the engine through ChatService as the app does; stop it (and its process tree) on exit."""
    service = ChatService.from_config(cfg)
    service.start()
    try:
        print(f"Starting the engine (log: {cfg.paths.engine_log}) ...", file=sys.stderr, flush=True)
        if not await service.supervisor.wait_ready(cfg.timeouts.startup_s):
            st = service.supervisor.status
            raise BenchmarkError(
                f"The engine did not start: {st.error or st.state.value}",
                (st.hint or "") + (f"\n{st.log_tail}" if st.log_tail else "") + f"\nFull log: {cfg.paths.engine_log}",
            )
        sup = service.supervisor
        spec = sup.spec
        assert spec is not None

        async def memory() -> int | None:
            pid = sup.status.pid
            return await asyncio.to_thread(tree_rss_bytes, pid) if pid else None

        yield Server(
            kind="managed",
            engine=spec.engine,
            endpoint=service.endpoint,
            client=service.client,
            memory=memory,
            memory_source="RSS of the engine process tree",
            model_path=_model_argument(spec.argv),
            flags=sup.flags.model_dump(exclude_none=True, exclude_defaults=True),
            service=service,
        )
    finally:
        await service.stop()


@contextlib.asynccontextmanager
async def external_server(cfg: AppConfig, base_url: str, api_key: str, model: str | None) -> AsyncIterator[Server]:
    """Connect to a running OpenAI-compatible server."""
    root = base_url.rstrip("/").removesuffix("/v1")
    async with httpx.AsyncClient(timeout=10.0, trust_env=False) as http:
        try:
            resp = await http.get(root + "/v1/models", headers=bearer(api_key))
        except httpx.HTTPError as exc:
            raise BenchmarkError(
                f"{root} does not answer ({exc}).", "Check --base-url; is the server running?"
            ) from exc
        if resp.status_code != 200:
            raise BenchmarkError(f"{root}/v1/models answered {resp.status_code}.", "Check --api-key.")
        names = [m.get("id") for m in resp.json().get("data", [])]
        if model is None and not names:
            raise BenchmarkError(f"{root} lists no model.", "Pass --model.")
        model = model or names[0]
        api = await detect_api(http, root, bearer(api_key))  # how it counts tokens (llama-server's /props)
        endpoint = Endpoint(root, api_key, str(model), api=api)
        client = ChatClient(endpoint, cfg.timeouts.connect_s, cfg.timeouts.read_s, cfg.restart.request_retries)

        async def memory() -> int | None:
            return await metrics_rss_bytes(http, root)

        try:
            yield Server(
                kind="external",
                engine="external",
                endpoint=endpoint,
                client=client,
                memory=memory,
                memory_source="process_resident_memory_bytes from /metrics",
            )
        finally:
            await client.aclose()


async def server_version(endpoint: Endpoint) -> str | None:
    """The server's own version (vLLM's /version), if it tells."""
    async with httpx.AsyncClient(timeout=5.0, trust_env=False) as http:
        try:
            resp = await http.get(endpoint.base_url + "/version")
            return str(resp.json().get("version")) if resp.status_code == 200 else None
        except (httpx.HTTPError, ValueError, AttributeError):
            return None
