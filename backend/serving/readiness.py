"""Is the engine's server up? Its health path answers 200, and /v1/models lists the model we serve."""

from __future__ import annotations

import httpx

from backend.engines.base import LaunchSpec


async def is_healthy(http: httpx.AsyncClient, health_path: str = LaunchSpec.health_path) -> bool:
    """Whether the server answers its health check with 200."""
    try:
        return (await http.get(health_path)).status_code == 200
    except httpx.HTTPError:
        return False


async def is_ready(
    http: httpx.AsyncClient, headers: dict[str, str], served_name: str, health_path: str = LaunchSpec.health_path
) -> bool:
    """Whether the server is healthy and lists `served_name` among its models (it can answer chats)."""
    if not await is_healthy(http, health_path):
        return False
    try:
        models = await http.get("/v1/models", headers=headers)
        return models.status_code == 200 and any(m.get("id") == served_name for m in models.json().get("data", []))
    except (httpx.HTTPError, ValueError):
        return False
