"""`python -m backend doctor`: is the app up, is its engine up, how loaded is it, and what does its log say.

Finds the engine through the state file the supervisor writes (<data_dir>/engine.json) unless told
(--engine-url, --log); reads the engine's load on /metrics (the names its dialect declares); scans the engine
log's latest start for the engines' known failure signatures (backend.ops.signatures) and prints the cause and
the fix of each. Exit code 1 when something is wrong (with --strict, warnings count too).
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy.engine import make_url

from backend.api.access import api_enabled
from backend.config import AppConfig
from backend.engines.base import LaunchSpec, Severity
from backend.engines.registry import configured_engine, load_metrics
from backend.errors import ServiceError
from backend.ops.baseline_history import read_history, regression
from backend.ops.prometheus_text import sample_totals
from backend.ops.signatures import latest_start, scan
from backend.serving.state_file import read_state
from backend.storage.persistence import database_url
from backend.storage.quotas import Quotas, utc_day
from backend.storage.shared import SharedDatabase

OK, WARN, FAIL, SKIP = "ok", "warn", "fail", "skip"
LABELS = {OK: "[ OK ]", WARN: "[WARN]", FAIL: "[FAIL]", SKIP: "[SKIP]"}
KV_WARN = 0.9
TAIL_LINES = 12


@dataclass(frozen=True)
class Check:
    """One line of the diagnosis, with what to do when it is not ok."""

    name: str
    status: str
    summary: str
    cause: str = ""
    fix: str = ""
    line: str = ""


@dataclass(frozen=True)
class Target:
    """Where to look: the app, the engine and its log."""

    app_url: str | None
    engine_url: str
    engine_pid: int | None
    log: Path
    health_path: str = LaunchSpec.health_path  # an external server's is server.health_path (vLLM's router: /readiness)


def locate(
    cfg: AppConfig,
    app_url: str | None = None,
    engine_url: str | None = None,
    log: str | Path | None = None,
    no_app: bool = False,
) -> Target:
    """The given addresses first, then the state file, then the configuration (the app: app.port)."""
    state = read_state(cfg)
    return Target(
        app_url=None if no_app else (app_url or cfg.app.url).rstrip("/"),
        engine_url=(
            engine_url or state.get("base_url") or cfg.server.base_url or f"http://{cfg.server.host}:{cfg.server.port}"
        )
        .rstrip("/")
        .removesuffix("/v1"),
        engine_pid=None if engine_url else state.get("pid"),
        log=Path(log or state.get("log") or cfg.paths.engine_log),
        health_path=engine.health_path(cfg) if (engine := configured_engine(cfg)) else LaunchSpec.health_path,
    )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def tune_line(tune: dict[str, Any] | None) -> str:
    """What the engine tune chose on this machine and how fast it measured (empty when no tune ran)."""
    if not tune:
        return ""
    won = (tune.get("figures") or {}).get(tune.get("chosen")) or {}
    if not won.get("decode_tok_s_1"):
        return f"; engine tune: {tune.get('chosen') or 'no candidate served'}"
    return (
        f"; engine tune ({tune.get('when')}, {tune.get('seconds')} s): {tune.get('chosen')}, "
        f"{won['decode_tok_s_1']} tok/s and first text {won['first_text_ms_1']} ms at 1 user, "
        f"{won['decode_tok_s_n']} tok/s per reply at {tune.get('users')}"
    ) + places_text(tune.get("places"))


def places_text(places: dict[str, Any] | None) -> str:
    """The replies at once the tune measured best (empty when it measured none)."""
    if not places:
        return ""
    levels = ", ".join(
        f"{users} at once {level['total_tok_s']} tok/s in total ({level['per_reply_tok_s']} per reply)"
        for users, level in (places.get("levels") or {}).items()
        if level.get("total_tok_s") is not None
    )
    return f"; replies at once measured best at {places['chosen']}" + (f" ({levels})" if levels else "")


def line_text(line: dict[str, Any] | None) -> str:
    """How many replies the engine runs at once (its places) and the line in front of it now (empty: no line)."""
    if not line:
        return ""
    return (
        f"; the engine runs {line['places']} replies at once ({line['running']} running, {line['waiting']} waiting "
        f"in line, {line['refused']} told to come back later; a reply holds its place {line['reply_s']} s, a place "
        f"frees every {line.get('place_s', '?')} s while all are taken)"
    )


async def check_app(http: httpx.AsyncClient, url: str, headers: dict[str, str] | None = None) -> Check:
    payload: Any = None
    try:
        resp = await http.get(url + "/healthz", headers=headers)
    except httpx.HTTPError as exc:
        return Check(
            "app",
            FAIL,
            f"{url}/healthz does not answer ({type(exc).__name__}).",
            fix="Start the app (`chainlit run app.py --headless`), or pass --app-url (or --no-app to skip).",
        )
    try:
        payload = resp.json()
        engine = payload["engine"]
    except (ValueError, KeyError, TypeError):
        if resp.status_code in (200, 503) and isinstance(payload, dict) and "status" in payload:
            return Check(  # the detail is for the app's machine (web.monitoring)
                "app",
                OK if resp.status_code == 200 else FAIL,
                f"{url} is up, its engine {'ready' if resp.status_code == 200 else 'not ready'}; the detail is only "
                "for the app's machine.",
                fix="Run the doctor there, or set web.monitoring_token (the doctor sends it).",
            )
        return Check("app", FAIL, f"{url}/healthz answered {resp.status_code} without the app's health data.")
    restarts = f"{engine.get('restarts', 0)} restart(s)"
    check = payload.get("check") or {}
    if check:
        fallbacks = check.get("fallbacks") or []
        restarts += f"; serving {check.get('candidate')}, answer check {check.get('check')}"
        if fallbacks:
            restarts += f"; fell back after: {'; '.join(fallbacks)}"
    restarts += tune_line(payload.get("tune")) + line_text(payload.get("line"))
    if resp.status_code == 200:
        return Check("app", OK, f"{url} is up; engine {engine.get('state')}, {restarts}.")
    return Check(
        "app",
        FAIL,
        f"{url} is up but its engine is {engine.get('state')} ({restarts}).",
        cause=engine.get("error") or "",
        fix="See the engine checks below; the app retries on the next message.",
    )


async def check_engine(http: httpx.AsyncClient, target: Target) -> Check:
    url = target.engine_url + target.health_path
    pid = target.engine_pid
    process = "" if pid is None else f" (pid {pid} {'running' if _alive(pid) else 'not running'})"
    try:
        resp = await http.get(url)
    except httpx.HTTPError as exc:
        return Check(
            "engine",
            FAIL,
            f"{url} does not answer ({type(exc).__name__}){process}.",
            fix="The engine is not running: start the app (it starts the engine) and see the log findings below.",
        )
    if resp.status_code != 200:
        return Check("engine", FAIL, f"{url} answered {resp.status_code}{process}: the engine is not ready.")
    return Check("engine", OK, f"{url} answers 200{process}.")


async def check_metrics(http: httpx.AsyncClient, target: Target) -> Check:
    try:
        resp = await http.get(target.engine_url + "/metrics")
        totals = sample_totals(resp.text) if resp.status_code == 200 else {}
    except (httpx.HTTPError, ValueError) as exc:
        return Check("engine metrics", WARN, f"/metrics could not be read ({type(exc).__name__}).")
    names = load_metrics(totals)
    if names is None:
        return Check("engine metrics", SKIP, "the server exports no load metrics the doctor reads.")
    running = int(totals[names.running])
    waiting = int(totals.get(names.waiting, 0))
    kv = totals.get(names.cache_usage, 0.0)
    preemptions = int(totals.get(names.preemptions, 0))
    summary = f"{running} running, {waiting} waiting, KV cache {kv * 100:.1f} % used, {preemptions} preemption(s)."
    if kv >= KV_WARN or preemptions:
        return Check(
            "engine metrics",
            WARN,
            summary,
            cause="The KV cache is (or was) too small for the load: requests were preempted or must wait.",
            fix="Raise engine.flags.cpu_kvcache_space_gib, or lower engine.flags.max_num_seqs.",
        )
    return Check("engine metrics", OK, summary)


def _read_log(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None


def check_log(path: Path, whole: bool, engine_up: bool) -> list[Check]:
    """One check per known signature in the log (its latest start unless `whole`)."""
    text = _read_log(path)
    if text is None:
        return [Check("engine log", SKIP, f"{path} does not exist (the engine never started with this data_dir).")]
    part = text if whole else latest_start(text)
    scope = "whole log" if whole else "latest start"
    findings = scan(part)
    checks = [
        Check(
            "engine log",
            FAIL if f.signature.severity == Severity.ERROR else WARN,
            f"{f.signature.title} ({f.count} line(s) in the {scope} of {path}).",
            cause=f.cause,
            fix=f.signature.fix,
            line=f.line,
        )
        for f in findings
    ]
    if not checks:
        tail = "" if engine_up else "\n".join(part.strip().splitlines()[-TAIL_LINES:])
        checks.append(
            Check(
                "engine log",
                OK,
                f"no known failure in the {scope} of {path}.",
                line=f"last lines:\n{tail}" if tail else "",
            )
        )
    return checks


async def check_usage(cfg: AppConfig, now: float | None = None) -> Check:
    """Today's usage (UTC) by route, from the database the quotas count in (backend.storage.quotas)."""
    if not (cfg.auth.enabled or api_enabled(cfg)):
        return Check("usage", SKIP, "no quotas or API without login (api.enabled is off).")
    url = database_url(cfg)
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite" and not await asyncio.to_thread(Path(parsed.database or "").exists):
        return Check("usage", SKIP, f"no database yet ({parsed.database}).")
    db = SharedDatabase(url)
    try:
        rows = await Quotas(db, cfg.api).usage(since_day=utc_day(time.time() if now is None else now))
    except ServiceError as exc:
        return Check("usage", WARN, f"cannot be read: {exc.message}", fix=exc.hint)
    finally:
        await db.close()
    if not rows:
        return Check("usage", OK, "nothing yet today (UTC).")
    parts = []
    for route in ("chat", "api"):
        mine = [r for r in rows if r.route == route]
        prompt, reply = sum(r.prompt_tokens for r in mine), sum(r.reply_tokens for r in mine)
        parts.append(f"{route}: {sum(r.requests for r in mine)} requests, {prompt} prompt + {reply} reply tokens")
    users = len({r.user for r in rows})
    return Check("usage", OK, f"today (UTC), {users} user(s): " + "; ".join(parts) + " (per user: api-key usage).")


def check_baseline(history: list[dict[str, Any]]) -> Check:
    """The daily baseline: the newest `bench --snapshot` against the recent ones (backend.ops.baseline_history)."""
    if not history:
        return Check("baseline", SKIP, "no snapshots yet (python -m backend bench --snapshot adds one).")
    found = regression(history)
    if found:
        return Check(
            "baseline",
            WARN,
            f"slower than the recent snapshots: {found}.",
            cause="a change of code, engine, flags or machine since the earlier snapshots",
            fix="compare the snapshots' commits, engines and devices in bench-history.jsonl; rerun the snapshot "
            "on a quiet machine to rule out a busy one",
        )
    newest = history[-1]
    one = (newest.get("levels") or {}).get("1", {}).get("tok_s")
    return Check(
        "baseline", OK, f"{len(history)} snapshot(s); the newest: {one} tok/s at 1 user ({newest.get('time')})."
    )


async def diagnose(
    target: Target, whole_log: bool = False, timeout_s: float = 5.0, app_token: str | None = None
) -> list[Check]:
    """Run every check and return them in order; `app_token`: the app's web.monitoring_token (its health detail)."""
    checks: list[Check] = []
    async with httpx.AsyncClient(timeout=timeout_s, trust_env=False) as http:
        if target.app_url:
            app_headers = {"Authorization": f"Bearer {app_token}"} if app_token else {}
            checks.append(await check_app(http, target.app_url, app_headers))
        engine = await check_engine(http, target)
        checks.append(engine)
        if engine.status == OK:
            checks.append(await check_metrics(http, target))
    checks += await asyncio.to_thread(check_log, target.log, whole_log, engine.status == OK)
    return checks


def render(checks: list[Check]) -> str:
    """The diagnosis as text: one line per check, cause, fix and the log line indented below."""
    lines = ["ERNIE chat doctor"]
    for c in checks:
        lines.append(f"{LABELS[c.status]} {c.name}: {c.summary}")
        for label, value in (("cause", c.cause), ("fix", c.fix), ("log", c.line)):
            if value:
                lines += [
                    f"       {label}: {row}" if i == 0 else f"         {row}"
                    for i, row in enumerate(value.splitlines())
                ]
    fails = sum(c.status == FAIL for c in checks)
    warns = sum(c.status == WARN for c in checks)
    lines.append(f"Result: {fails} problem(s), {warns} warning(s).")
    return "\n".join(lines)


def exit_code(checks: list[Check], strict: bool = False) -> int:
    """1 when a check failed (or, with strict, warned); else 0."""
    bad = {FAIL, WARN} if strict else {FAIL}
    return int(any(c.status in bad for c in checks))


def doctor_command(
    cfg: AppConfig,
    app_url: str | None = None,
    engine_url: str | None = None,
    log: str | Path | None = None,
    no_app: bool = False,
    whole_log: bool = False,
    strict: bool = False,
    timeout_s: float = 5.0,
) -> int:
    """`doctor`: run every check, print the diagnosis, return the exit code."""
    target = locate(cfg, app_url=app_url, engine_url=engine_url, log=log, no_app=no_app)
    token = cfg.web.monitoring_token.get_secret_value() if cfg.web.monitoring_token else None
    checks = asyncio.run(diagnose(target, whole_log, timeout_s, token))
    checks.append(asyncio.run(check_usage(cfg)))
    checks.append(check_baseline(read_history(cfg)))
    print(render(checks))
    return exit_code(checks, strict)
