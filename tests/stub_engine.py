"""A stand-in engine process for supervisor unit tests: a real child serving /health and /v1/models.

usage: python stub_engine.py PORT MODEL [--exit-at-start CODE] [--die-with SIGNAL] [--ready-after S] [--spawn-child]
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def main() -> None:
    port, model = int(sys.argv[1]), sys.argv[2]
    opts = sys.argv[3:]
    print(f"stub engine starting on {port}", flush=True)
    if "--exit-at-start" in opts:
        print("ValueError: unknown flag --bogus", flush=True)
        sys.exit(int(opts[opts.index("--exit-at-start") + 1]))
    if "--die-with" in opts:  # like kernels built for instructions this CPU does not run: SIGILL
        os.kill(os.getpid(), signal.Signals[opts[opts.index("--die-with") + 1]])
    ready_at = time.monotonic() + (float(opts[opts.index("--ready-after") + 1]) if "--ready-after" in opts else 0)
    if "--spawn-child" in opts:  # like vLLM's engine core: a grandchild in the same process group
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        print(f"child pid {child.pid}", flush=True)

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            if time.monotonic() < ready_at:
                self.send_response(503)
                self.end_headers()
                return
            if self.path == "/health":
                body = b""
            elif self.path == "/v1/models":
                body = json.dumps({"data": [{"id": model, "max_model_len": 1024}]}).encode()
            else:
                self.send_response(404)
                self.end_headers()
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()


if __name__ == "__main__":
    main()
