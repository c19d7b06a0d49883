"""The tests' one stand-in for an OpenAI-compatible engine (standard library only).

What a test asks of an engine, in one server:
- GET /health and /v1/models (503 until it is ready);
- POST /v1/chat/completions, and /v1/completions with a prompt of token ids: the reply streamed word by word as
  server-sent events in a chunked body (its pieces, the finish, the usage, [DONE]);
- scripted answers instead, one per request (`script`: an HTTP error, a reset connection, a stream that ends
  without its finish, breaks, stalls, or never starts), and a test's own (an Exchange's means to answer);
- with a dialect, a prompt's tokens counted as that engine's /tokenize answers (vLLM's: the messages in, the count and
  ids out; llama-server's: /apply-template, then /tokenize of its text) and the log-probabilities of fixed token ids
  as it gives them (vLLM's prompt_logprobs, llama-server's /completion n_probs: the answer check), from `tokens` and
  `logprobs`; without one these answer 404, as a server that cannot count, and the app estimates.
A token is a word, and the stand-in's chat template adds nothing, unless a test gives its own `tokens`.

In a test's process, StubEngine serves from a thread while a `with` lasts; it records what it was asked (`requests`,
`paths`, `authorizations`), the test decides when it is ready (`ready`) and may hold a request (`hold_path`,
`held`, `release`). As a child process (an engine the supervisor starts, watches and restarts):

usage: python stub_engine.py PORT MODEL [--exit-at-start CODE] [--die-with SIGNAL] [--ready-after S] [--spawn-child]
                             [--reply TEXT] [--break-after N] [--count-prompt] [--word-s S]

--break-after N drops the connection after N words, in the middle of the chunked body (an engine that dies
mid-reply); --count-prompt makes the usage's prompt_tokens the request's tokens (else 1); --word-s S sends each word S
seconds after the one before (an engine decoding while the app reads). Every POST prints REQUEST_LINE, so a test can
count them in the output; its /v1/models says a context window of 1024.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler
from typing import Any

if __package__:  # imported by a test
    from tests.deadlines import WAIT_S
    from tests.http_server import ThreadedServer
else:  # run by its path as a child process: its neighbours in tests/ are top-level modules
    from deadlines import WAIT_S
    from http_server import ThreadedServer

DONE = "[DONE]"
REQUEST_LINE = "request POST {path}"  # what the child prints for every POST
COMPLETIONS = ("/v1/chat/completions", "/v1/completions")


# ----- what it says: an OpenAI-compatible stream ------------------------------------------------------------------
def chunk(model: str, choices: list[dict[str, Any]], usage: dict[str, int] | None = None) -> dict[str, Any]:
    """One chat.completion.chunk."""
    data: dict[str, Any] = {"id": "stub", "object": "chat.completion.chunk", "created": 0, "model": model}
    data["choices"] = choices
    if usage is not None:
        data["usage"] = usage
    return data


def piece(model: str, text: str, completion: bool = False) -> dict[str, Any]:
    """A chunk of the reply's text (of a completion's, with `completion`)."""
    if completion:
        return {"object": "text_completion", "choices": [{"index": 0, "text": text, "finish_reason": None}]}
    return chunk(model, [{"index": 0, "delta": {"content": text}, "finish_reason": None}])


def finish(model: str, reason: str = "stop", completion: bool = False) -> dict[str, Any]:
    """The chunk that says why the reply ended."""
    if completion:
        return {"choices": [{"index": 0, "text": "", "finish_reason": reason}]}
    return chunk(model, [{"index": 0, "delta": {}, "finish_reason": reason}])


def usage(model: str, prompt: int, completion: int) -> dict[str, Any]:
    """The last chunk: the request's token counts (stream_options.include_usage)."""
    counts = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
    return chunk(model, [], counts)


def words(reply: str) -> list[str]:
    """The reply's pieces: word by word, each but the last with its space."""
    parts = reply.split(" ")
    return [word if i == len(parts) - 1 else word + " " for i, word in enumerate(parts)]


def event(data: dict[str, Any] | str) -> bytes:
    """One server-sent event."""
    return f"data: {data if isinstance(data, str) else json.dumps(data)}\n\n".encode()


def http_chunk(data: bytes) -> bytes:
    """`data` as one chunk of a chunked HTTP body (b"" ends the body)."""
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def word_ids(messages: Sequence[dict[str, Any]]) -> list[int]:
    """A conversation's token ids as the stand-in's model has them: one a word, the template adding none."""
    return list(range(sum(len(str(m.get("content", "")).split()) for m in messages)))


# ----- one request and the ways to answer it ----------------------------------------------------------------------
class Exchange:
    """One POST being answered: what was asked (`path`, `body`, `index`: the n-th POST), and the means to answer."""

    def __init__(self, handler: BaseHTTPRequestHandler, engine: StubEngine, body: dict[str, Any], index: int) -> None:
        self.handler, self.engine, self.path, self.body, self.index = handler, engine, handler.path, body, index
        self.model = str(body.get("model") or engine.served_name)
        self.completion = self.path == "/v1/completions"  # a prompt of token ids: text completions

    def send_json(self, code: int, data: Any = None) -> None:
        """A whole JSON answer (no body for None)."""
        raw = b"" if data is None else json.dumps(data).encode()
        self.handler.send_response(code)
        self.handler.send_header("Content-Type", "application/json")
        self.handler.send_header("Content-Length", str(len(raw)))
        self.handler.send_header("Connection", "close")
        self.handler.end_headers()
        self.handler.wfile.write(raw)

    def open_stream(self) -> None:
        """The head of a streamed answer: chunked, so a dropped connection is a broken body, not its end."""
        self.handler.send_response(200)
        self.handler.send_header("Content-Type", "text/event-stream")
        self.handler.send_header("Transfer-Encoding", "chunked")
        self.handler.send_header("Connection", "close")
        self.handler.end_headers()

    def send(self, data: dict[str, Any] | str) -> None:
        """One server-sent event, as one chunk, sent now."""
        self.handler.wfile.write(http_chunk(event(data)))
        self.handler.wfile.flush()

    def end_stream(self) -> None:
        """The chunked body's end."""
        self.handler.wfile.write(http_chunk(b""))

    def reset(self) -> None:
        """Drop the connection with a TCP reset, answering nothing (an engine that died under the request)."""
        sock = self.handler.connection
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.handler.rfile.close()  # its buffer holds the socket open: the close below is then the real one
        sock.close()
        self.handler.close_connection = True

    def until_client_leaves(self) -> None:
        """Wait (as long as the server runs) until the client closes its end; then `disconnected` is set."""
        sock = self.handler.connection
        self.engine.waiting.add(sock)
        try:
            while sock.recv(1024):
                pass
        except OSError:
            pass
        finally:
            self.engine.waiting.discard(sock)
        self.engine.disconnected.set()


Behaviour = Callable[[Exchange], None]


def status(code: int, message: str = "overloaded") -> Behaviour:
    """Answer HTTP `code` with an OpenAI error object saying `message`."""
    return lambda ex: ex.send_json(code, {"error": {"message": message, "type": "error", "code": code}})


def reset(ex: Exchange) -> None:
    """Drop the connection with a TCP reset before answering."""
    ex.reset()


def silent(ex: Exchange) -> None:
    """Accept the request and never answer."""
    ex.until_client_leaves()


def stream(*pieces: str, end: str = "done", word_s: float = 0.0) -> Behaviour:
    """Stream `pieces`, each `word_s` after the one before; then end properly ("done": finish, usage, [DONE]), end the
    body without a finish ("no_finish": [DONE] only), end it with neither ("closed": a router whose engine died),
    close the connection in the middle of the chunked body ("break"), or wait until the client goes away ("hang")."""

    def answer(ex: Exchange) -> None:
        ex.open_stream()
        for i, text in enumerate(pieces):
            if word_s and i:
                time.sleep(word_s)
            ex.send(piece(ex.model, text, ex.completion))
        if end == "done":
            ex.send(finish(ex.model, completion=ex.completion))
            ex.send(usage(ex.model, ex.engine.prompt_tokens(ex.body), len(pieces)))
        if end in ("done", "no_finish"):
            ex.send(DONE)
        if end in ("done", "no_finish", "closed"):
            ex.end_stream()
        elif end == "hang":
            ex.until_client_leaves()

    return answer


def reply(ex: Exchange) -> None:
    """The engine's own reply (StubEngine.reply), whole or broken after `break_after` words."""
    engine = ex.engine
    pieces = words(engine.reply)
    if engine.break_after is None:
        stream(*pieces, word_s=engine.word_s)(ex)
    else:
        stream(*pieces[: engine.break_after], end="break", word_s=engine.word_s)(ex)


# ----- the dialects' endpoints beside the OpenAI API --------------------------------------------------------------
def _ranked(logprobs: list[float]) -> list[int]:
    """Token ids, most likely first (ties in id order)."""
    return sorted(range(len(logprobs)), key=lambda t: -logprobs[t])


def _vllm(engine: StubEngine, path: str, body: dict[str, Any]) -> Any:
    if path == "/tokenize":
        ids = engine.tokens(body["messages"]) if "messages" in body else word_ids([{"content": body["prompt"]}])
        return {"count": len(ids), "max_model_len": engine.max_model_len, "tokens": ids}
    if path == "/v1/completions" and "prompt_logprobs" in body and engine.logprobs is not None:
        ids, k = body["prompt"], body["prompt_logprobs"]
        entries: list[Any] = [None]
        for i in range(1, len(ids)):
            lp = [float(v) for v in engine.logprobs(ids[:i])]
            ranks = _ranked(lp)
            entry = {str(t): {"logprob": lp[t], "rank": r + 1, "decoded_token": "x"} for r, t in enumerate(ranks[:k])}
            entry.setdefault(
                str(ids[i]), {"logprob": lp[ids[i]], "rank": ranks.index(ids[i]) + 1, "decoded_token": "x"}
            )
            entries.append(entry)
        return {"choices": [{"text": "x", "prompt_logprobs": entries}]}
    return None


def _llamacpp(engine: StubEngine, path: str, body: dict[str, Any]) -> Any:
    if path == "/apply-template":  # the stand-in's template: a text that keeps the messages
        return {"prompt": json.dumps(body["messages"])}
    if path == "/tokenize":
        try:
            messages = json.loads(body["content"])
        except ValueError:
            messages = None
        rendered = isinstance(messages, list) and all(isinstance(m, dict) for m in messages)
        return {"tokens": engine.tokens(messages) if rendered else word_ids([{"content": body["content"]}])}
    if path == "/completion" and engine.logprobs is not None:
        ids = body["prompt"]
        lp = [float(v) for v in engine.logprobs(ids)]
        top = [{"id": t, "token": "x", "bytes": [120], "logprob": lp[t]} for t in _ranked(lp)[: body["n_probs"]]]
        evaluated = len(ids) + engine.bos_added  # a prompt of ids gets no BOS, unless the build adds one
        return {"tokens_evaluated": evaluated, "completion_probabilities": [{**top[0], "top_logprobs": top}]}
    return None


DIALECTS: dict[str, Callable[[StubEngine, str, dict[str, Any]], Any]] = {"vllm": _vllm, "llama.cpp": _llamacpp}


# ----- the server -------------------------------------------------------------------------------------------------
class StubEngine(ThreadedServer):
    """The stand-in engine on `port` (by default one the OS picks): in a test's process from `with` to its end, or
    serving this process (serve, the child's). The n-th POST gets script[n] (the last one repeats); without a script,
    a chat or completion request gets `reply` and a dialect's endpoint its answer (or 404)."""

    def __init__(
        self,
        *script: Behaviour,
        reply: str = "A reply from the fake engine.",
        served_name: str = "ernie-4.5-0.3b",
        max_model_len: int = 4096,
        ready: bool = True,
        count_prompt: bool = False,
        break_after: int | None = None,
        word_s: float = 0.0,
        dialect: str | None = None,
        tokens: Callable[[list[dict[str, Any]]], list[int]] = word_ids,
        logprobs: Callable[[list[int]], Sequence[float]] | None = None,
        port: int = 0,
        announce: bool = False,
    ) -> None:
        self.script = script
        self.reply, self.served_name, self.max_model_len = reply, served_name, max_model_len
        self.count_prompt, self.break_after, self.word_s = count_prompt, break_after, word_s
        self.dialect, self.tokens, self.logprobs = dialect, tokens, logprobs
        self.bos_added = False  # llama-server adds a BOS to a prompt of ids (a build the answer check must notice)
        self.announce = announce  # print REQUEST_LINE for every POST (the child's output)
        self.ready = threading.Event()
        if ready:
            self.ready.set()
        self.requests: list[dict[str, Any]] = []  # the JSON bodies of chat and completion requests, in order
        self.paths: list[str] = []  # and their paths
        self.authorizations: set[str] = set()  # the Authorization headers of every request
        self.hold_path: str | None = None
        self.held, self.release = threading.Event(), threading.Event()
        self.disconnected = threading.Event()  # a client it was waiting on went away
        self.waiting: set[socket.socket] = set()  # the connections of requests that wait for their client to go
        self._posts = 0
        self._lock = threading.Lock()
        super().__init__(_handler(self), "stub-engine", port)

    def closing(self) -> None:
        self.release.set()
        for sock in list(self.waiting):  # their clients stay: the requests end with the server
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def app_overrides(self) -> dict[str, str]:
        """start_app() overrides that make the app talk to this server (an external engine: nothing starts)."""
        return {"engine__name": "external", "server__base_url": f"{self.url}/v1"}

    def conversations(self) -> list[list[tuple[str, str]]]:
        """(role, content) of each chat request's user and assistant messages (the system prompt left out)."""
        with self._lock:
            bodies = [b for b in self.requests if "messages" in b]
        return [[(m["role"], m["content"]) for m in b["messages"] if m["role"] != "system"] for b in bodies]

    def prompt_tokens(self, body: dict[str, Any]) -> int:
        """The usage's prompt_tokens for a request: its tokens with count_prompt, else 1."""
        if not self.count_prompt:
            return 1
        return len(body["prompt"]) if "prompt" in body else len(self.tokens(body.get("messages") or []))

    def _answer(self, handler: BaseHTTPRequestHandler, body: dict[str, Any]) -> None:
        with self._lock:
            index, self._posts = self._posts, self._posts + 1
            if handler.path in COMPLETIONS and "prompt_logprobs" not in body:
                self.requests.append(body)
                self.paths.append(handler.path)
        ex = Exchange(handler, self, body, index)
        if self.script:
            self.script[min(index, len(self.script) - 1)](ex)
        elif handler.path in COMPLETIONS and "prompt_logprobs" not in body:
            reply(ex)
        else:
            found = DIALECTS[self.dialect](self, handler.path, body) if self.dialect else None
            if found is None:
                ex.send_json(404, {"error": "not found"})
            else:
                ex.send_json(200, found)


def _handler(engine: StubEngine) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # chunked streams; every answer closes its connection

        def log_message(self, *args: object) -> None:
            pass

        def _hold(self) -> None:
            engine.authorizations.add(self.headers.get("Authorization", ""))
            if self.path == engine.hold_path:
                engine.held.set()
                engine.release.wait(WAIT_S)

        def _plain(self, code: int, data: Any) -> None:
            raw = json.dumps(data).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(raw)

        def do_GET(self) -> None:
            self._hold()
            if not engine.ready.is_set():
                self._plain(503, {"error": "starting"})
            elif self.path == "/health":
                self._plain(200, {})
            elif self.path == "/v1/models":
                model = {"id": engine.served_name, "object": "model", "max_model_len": engine.max_model_len}
                self._plain(200, {"object": "list", "data": [model]})
            else:
                self._plain(404, {"error": "not found"})

        def do_POST(self) -> None:
            if engine.announce:
                print(REQUEST_LINE.format(path=self.path), flush=True)
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
            self._hold()
            if not engine.ready.is_set():
                self._plain(503, {"error": "starting"})
            else:
                engine._answer(self, body)

    return Handler


# ----- as a child process -----------------------------------------------------------------------------------------
def command(port: int, model: str, *options: str) -> list[str]:
    """The command line that serves the stand-in on `port` as a child process (the usage above: `options`)."""
    return [sys.executable, os.path.abspath(__file__), str(port), model, *options]


def main(argv: list[str]) -> None:
    port, model, opts = int(argv[0]), argv[1], argv[2:]

    def option(name: str) -> str | None:
        return opts[opts.index(name) + 1] if name in opts else None

    print(f"stub engine starting on {port}", flush=True)
    if (code := option("--exit-at-start")) is not None:
        print("ValueError: unknown flag --bogus", flush=True)
        sys.exit(int(code))
    if (name := option("--die-with")) is not None:  # like kernels built for instructions this CPU lacks: SIGILL
        os.kill(os.getpid(), signal.Signals[name])
    if "--spawn-child" in opts:  # like vLLM's engine core: a grandchild in the same process group
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        print(f"child pid {child.pid}", flush=True)
    engine = StubEngine(
        reply=option("--reply") or "Hello from the stub engine.",
        served_name=model,
        max_model_len=1024,
        ready=option("--ready-after") is None,
        count_prompt="--count-prompt" in opts,
        break_after=None if (n := option("--break-after")) is None else int(n),
        word_s=float(option("--word-s") or 0.0),
        port=port,
        announce=True,
    )
    if (after := option("--ready-after")) is not None:
        threading.Timer(float(after), engine.ready.set).start()
    engine.serve()


if __name__ == "__main__":
    main(sys.argv[1:])
