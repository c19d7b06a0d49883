"""What one key holder's large API request costs another user, before and after the request-size limit (issue 40,
finding 3): the app with login on and the offline demo model on llama.cpp, two users with keys. User A sends a
conversation of SIZE bytes (many earlier turns, a short last message); 0.5 s later user B sends a 4-token request. A's
time to its answer and B's, median of ROUNDS, beside B's alone.

    .venv/bin/python results/security/measure_body_limits.py --sizes 19.9,2,1 --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from backend.accounts.passwords import hash_password
from backend.accounts.users import write_users_file
from tests.app_process import launch_app, login_env
from tests.chat_api import login

PASSWORD = "measure-password"


def conversation(size: int) -> list[dict[str, str]]:
    turn = "Tell me more about the history of the city and its rivers. " * 160  # ~9.6 KB a turn
    messages, total = [], 0
    while total < size:
        role = "user" if len(messages) % 2 == 0 else "assistant"
        messages.append({"role": role, "content": turn})
        total += len(turn) + 40
    if messages[-1]["role"] == "user":
        messages.append({"role": "assistant", "content": "Yes."})
    messages.append({"role": "user", "content": "Thanks!"})
    return messages


async def key_of(url: str, user: str) -> str:
    http = await login(url, user, PASSWORD)
    try:
        return str((await http.post("/api-keys/api/keys", json={"name": "measure"})).json()["key"])
    finally:
        await http.aclose()


async def timed(http: httpx.AsyncClient, key: str, body: bytes) -> tuple[float, int]:
    """(seconds, status) of one request; status 0: the connection broke before an answer."""
    started = time.monotonic()
    try:
        answer = await http.post(
            "/v1/chat/completions",
            content=body,
            headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
        )
    except httpx.TransportError:
        return time.monotonic() - started, 0
    return time.monotonic() - started, answer.status_code


async def measure(url: str, sizes: list[float], rounds: int) -> list[str]:
    keys = {user: await key_of(url, user) for user in ("ann", "ben")}
    small = json.dumps({"model": "auto", "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]}).encode()
    lines = ["| A's request | A: status, s | B (4 tokens) meanwhile, s | B alone, s |", "|---|---|---|---|"]
    async with httpx.AsyncClient(base_url=url, trust_env=False, timeout=600) as http:
        await timed(http, keys["ben"], small)  # warm
        for size_mb in sizes:
            body = json.dumps({"model": "auto", "max_tokens": 4, "messages": conversation(int(size_mb * 1e6))}).encode()
            a_s, b_s, alone, status = [], [], [], 0
            for _ in range(rounds):
                alone.append((await timed(http, keys["ben"], small))[0])
                big = asyncio.create_task(timed(http, keys["ann"], body))
                await asyncio.sleep(0.5)
                b_s.append((await timed(http, keys["ben"], small))[0])
                took, status = await big
                a_s.append(took)
                await asyncio.sleep(2)
            lines.append(
                f"| {len(body) / 1e6:.1f} MB | {status}, {statistics.median(a_s):.2f} | "
                f"{statistics.median(b_s):.2f} | {statistics.median(alone):.2f} |"
            )
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="19.9,2,1", help="A's request sizes in MB, comma-separated")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="body-limits-"))
    users = root / "users.yaml"
    write_users_file(users, {name: hash_password(PASSWORD) for name in ("ann", "ben")})
    env = login_env(root / "data", Path("demo"), users)
    env.pop("ERNIE_MODEL__ID")  # the offline demo model
    env.update({"ERNIE_ENGINE__NAME": "llama.cpp", "ERNIE_CHAT__MAX_TOKENS": "4"})
    app = launch_app(env, root / "app.log")
    try:
        app.wait_ready(600)
        lines = asyncio.run(measure(app.url, [float(s) for s in args.sizes.split(",")], args.rounds))
    finally:
        app.stop()
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
