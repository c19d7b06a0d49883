"""The container files say what the rest of the project says: files they copy exist, the GPU image is the vLLM
release the engine requirements pin, both images check /healthz on the app's port. (Neither image can be built
on these machines: no Docker, no GPU; this is what can be checked without building.)"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from backend.config import APP_PORT, ROOT

DOCKERFILES = ["Dockerfile", "Dockerfile.gpu"]


def instructions(name: str) -> list[tuple[str, str]]:
    text = (ROOT / name).read_text(encoding="utf-8").replace("\\\n", " ")
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line else "") for line in lines]


@pytest.mark.parametrize("name", DOCKERFILES)
def test_every_file_a_dockerfile_copies_exists(name: str) -> None:
    for op, args in instructions(name):
        if op == "COPY" and not args.startswith("--from"):
            *sources, _ = args.split()
            for source in sources:
                assert source == "." or (ROOT / source).exists(), f"{name} copies {source}, which does not exist"


@pytest.mark.parametrize("name", DOCKERFILES)
def test_files_land_where_they_are_in_the_project(name: str) -> None:
    """The Makefile run inside the image finds what it needs at the paths it uses here (backend/child/...)."""
    for op, args in instructions(name):
        if op != "COPY" or args.startswith("--from"):
            continue
        *sources, dest = args.split()
        for source in sources:
            if source == ".":
                assert dest in (".", "./"), f"{name}: the whole project goes to the working directory"
                continue
            landed = Path(dest) / Path(source).name if dest.endswith("/") else Path(dest)
            target = Path(dest) if source.endswith("/") else landed
            assert Path(source.rstrip("/")) == target.with_name(target.name.rstrip("/")), (
                f"{name}: COPY {source} {dest} puts it at {target}, not where the project has it"
            )


@pytest.mark.parametrize("name", DOCKERFILES)
def test_the_image_checks_the_apps_health_on_its_port(name: str) -> None:
    found = dict(instructions(name))
    assert f"127.0.0.1:{APP_PORT}/healthz" in found["HEALTHCHECK"]
    assert str(APP_PORT) in found["EXPOSE"] and f'"--port", "{APP_PORT}"' in found["CMD"]


def test_the_gpu_image_is_the_vllm_release_the_engine_pins() -> None:
    pinned = re.search(r"^vllm==(\S+)$", (ROOT / "requirements-engine-cuda.txt").read_text(), re.M)
    assert pinned is not None
    base = dict(instructions("Dockerfile.gpu"))["FROM"]
    assert base == f"vllm/vllm-openai:v{pinned.group(1)}"


def test_the_compose_example_builds_the_gpu_image_and_asks_for_a_gpu() -> None:
    compose = yaml.safe_load((ROOT / "compose.gpu.yaml").read_text(encoding="utf-8"))
    service = compose["services"]["ernie-chat"]
    assert Path(service["build"]["dockerfile"]).name == "Dockerfile.gpu"
    assert f"{APP_PORT}:{APP_PORT}" in service["ports"]
    devices = service["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["driver"] == "nvidia" and "gpu" in devices[0]["capabilities"]
