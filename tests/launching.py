"""Building an engine's launch in tests the way backend.serving.launch does: profile flags, then the engine's own."""

from __future__ import annotations

import dataclasses

import pytest

from backend.chat.service import ChatService
from backend.config import AppConfig, EngineFlags, EngineName
from backend.engines.base import LaunchSpec, Target
from backend.engines.registry import engine
from backend.serving.launch import make_supervisor
from backend.serving.profiles import choose_profile, effective_flags
from backend.serving.supervisor import State, Status
from tests.deadlines import ENGINE_S


def launch(
    cfg: AppConfig,
    name: EngineName,
    model: str,
    port: int,
    api_key: str,
    python: str = "/py",
    flags: EngineFlags | None = None,
) -> LaunchSpec:
    """The LaunchSpec that engine `name` builds for `model` (with the chosen profile's flags unless given)."""
    chosen = engine(name)
    if flags is None:
        flags = chosen.flags(cfg, effective_flags(cfg, choose_profile(cfg, chosen)))
    return chosen.launch(cfg, Target(model, port, api_key, python), flags)


async def failed_start(cfg: AppConfig) -> Status:
    """Start the engine of `cfg` with the app's supervisor, expecting it to give up; its status then."""
    supervisor = make_supervisor(cfg)
    supervisor.start_background()
    try:
        assert not await supervisor.wait_ready(ENGINE_S), "the engine started"
        assert supervisor.status.state == State.FAILED, supervisor.status
        return dataclasses.replace(supervisor.status)  # a copy: stopping changes the supervisor's own
    finally:
        await supervisor.stop()


async def serving(cfg: AppConfig, timeout_s: float = ENGINE_S) -> ChatService:
    """The app's chat service for `cfg`, started and ready (the test fails with the supervisor's status if not)."""
    service = ChatService.from_config(cfg)
    service.start()
    if not await service.supervisor.wait_ready(timeout_s):
        await service.stop()
        pytest.fail(f"{cfg.engine.name} not ready: {service.supervisor.status}")
    return service
