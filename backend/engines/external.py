"""An OpenAI-compatible server (or vLLM fleet) the user runs: the app only talks to it at server.base_url."""

from __future__ import annotations

from backend.config import AppConfig, EngineFlags
from backend.engines.base import Engine, LaunchSpec, Note, Target
from backend.errors import ConfigError
from backend.models.resolve import ResolvedModel


class External(Engine):
    """Nothing to start, install or check: readiness is the server's health path (server.health_path, /health by
    default) and its /v1/models. Behind vLLM's router the path is /readiness: 200 while at least one of its engines
    can serve, where the router's /health is 503 while any one of them is down (which would make every app process
    in front of it stop serving when one engine of the fleet dies)."""

    name = "external"
    spawns = False
    uses_profiles = False

    def health_path(self, cfg: AppConfig) -> str:
        return cfg.server.health_path

    def resolve(self, cfg: AppConfig, python: str, note: Note) -> ResolvedModel:
        return ResolvedModel(cfg.model.id)

    def launch(self, cfg: AppConfig, target: Target, flags: EngineFlags, variant: str | None = None) -> LaunchSpec:
        url = cfg.server.base_url
        if not url:
            raise ConfigError.of("config.external_no_url")
        return LaunchSpec(
            engine=self.name,
            argv=[],
            env={},
            host="",
            port=0,
            served_name=cfg.model.served_name,
            api_key=target.api_key,
            url=url.rstrip("/").removesuffix("/v1"),
            health_path=self.health_path(cfg),
            capacity=cfg.server.places,
        )
