"""The external engine: a server the user runs, reached at server.base_url; a clear error without a URL."""

from __future__ import annotations

import pytest

from backend.config import load_config
from backend.errors import ConfigError
from tests.launching import launch


@pytest.mark.parametrize("given", ["http://10.1.2.3:8000/v1/", "http://10.1.2.3:8000/v1", "http://10.1.2.3:8000"])
def test_an_external_engine_is_reached_at_its_base_url_without_v1_and_nothing_is_started(given: str) -> None:
    cfg = load_config(environ={"ERNIE_ENGINE__NAME": "external", "ERNIE_SERVER__BASE_URL": given})
    spec = launch(cfg, "external", cfg.model.id, 0, "k")
    assert spec.base_url == "http://10.1.2.3:8000"
    assert spec.argv == [] and not spec.spawns
    assert spec.health_path == "/health"


def test_an_external_engine_is_checked_at_the_health_path_it_is_given() -> None:
    """vLLM's router: /readiness (200 while one engine can serve), not its /health (503 while any one is down)."""
    environ = {"ERNIE_ENGINE__NAME": "external", "ERNIE_SERVER__BASE_URL": "http://router:8000/v1"}
    cfg = load_config(environ={**environ, "ERNIE_SERVER__HEALTH_PATH": "/readiness"})
    assert launch(cfg, "external", cfg.model.id, 0, "k").health_path == "/readiness"


def test_a_health_path_without_its_leading_slash_is_a_configuration_error() -> None:
    with pytest.raises(ConfigError):
        load_config(environ={"ERNIE_ENGINE__NAME": "external", "ERNIE_SERVER__HEALTH_PATH": "readiness"})


def test_an_external_engine_without_base_url_is_a_configuration_error_saying_so() -> None:
    cfg = load_config(environ={"ERNIE_ENGINE__NAME": "external", "ERNIE_SERVER__BASE_URL": ""})
    with pytest.raises(ConfigError) as caught:
        launch(cfg, "external", cfg.model.id, 0, "k")
    assert caught.value.code == "config.external_no_url"
    assert "base_url" in caught.value.message
