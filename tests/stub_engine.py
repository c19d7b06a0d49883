"""A stand-in engine process for unit tests: a real child serving /health, /v1/models and a streamed chat.

usage: python stub_engine.py PORT MODEL [--exit-at-start CODE] [--die-with SIGNAL] [--ready-after S] [--spawn-child]
                             [--reply TEXT] [--break-after N] [--count-prompt] [--word-s S]

POST /v1/chat/completions streams --reply word by word as server-sent events (finish_reason "stop", then usage);
with --break-after N the stub drops the connection after N words, in the middle of the chunked body, like an
engine that dies mid-reply; with --count-prompt the usage chunk's prompt_tokens is the number of words in the
request's messages (else 1); with --word-s S each word comes S seconds after the one before (an engine decoding
while the app reads). Every POST prints "request POST <path>" so a test can count them in the output.
Other POST paths answer 404 (so /tokenize is "not supported": the client estimates).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from openai_stream import http_chunk, reply_events  # its neighbour in tests/ (this runs as a script)


def main() -> None:
    port, model = int(sys.argv[1]), sys.argv[2]
    opts = sys.argv[3:]
    print(f"stub engine starting on {port}", flush=True)
    if "--exit-at-start" in opts:
        print("ValueError: unknown flag --bogus", flush=True)
        sys.exit(int(opts[opts.index("--exit-at-start") + 1]))
    if "--die-with" in opts:  # like kernels built for instructions this CPU does not run: SIGILL
        os.kill(os.getpid(), signal.Signals[opts[opts.index("--die-with") + 1]])
    reply = opts[opts.index("--reply") + 1] if "--reply" in opts else "Hello from the stub engine."
    break_after = int(opts[opts.index("--break-after") + 1]) if "--break-after" in opts else None
    word_s = float(opts[opts.index("--word-s") + 1]) if "--word-s" in opts else 0.0
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

        def do_POST(self) -> None:
            print(f"request POST {self.path}", flush=True)
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if self.path != "/v1/chat/completions" or time.monotonic() < ready_at:
                self.send_response(404 if time.monotonic() >= ready_at else 503)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.protocol_version = "HTTP/1.1"  # chunked: a dropped connection is a broken body, not its end
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.send_header("Connection", "close")
            self.end_headers()
            pieces = len(reply.split(" "))
            prompt_tokens = 1
            if "--count-prompt" in opts:
                messages = json.loads(body or b"{}").get("messages") or []
                prompt_tokens = sum(len(str(m.get("content", "")).split()) for m in messages)
            for i, data in enumerate(reply_events(model, reply, prompt_tokens)):
                if break_after is not None and break_after <= i < pieces:
                    return  # no finish_reason and no last chunk
                if word_s and 0 < i < pieces:
                    time.sleep(word_s)
                self._chunk(data)
            self._chunk(b"")

        def _chunk(self, data: bytes) -> None:
            self.wfile.write(http_chunk(data))
            self.wfile.flush()

    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()


if __name__ == "__main__":
    main()
