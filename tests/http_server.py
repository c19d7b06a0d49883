"""A local HTTP server served from a thread while a test's `with` lasts: the base of the in-process stand-ins
(tests/stub_engine.StubEngine, tests/app_process.RecordingProxy, the cross-origin and sign-in tests' sites).
Standard library only: tests/stub_engine.py, run as a child process, imports it as its neighbour."""

from __future__ import annotations

import asyncio
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self


class QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):  # a client that went away (a stopped reply) is fine
            super().handle_error(request, client_address)


class ThreadedServer:
    """`handler` on `port` (by default one the OS picks), from `with` to its end; or in this thread (serve)."""

    def __init__(self, handler: type[BaseHTTPRequestHandler], name: str, port: int = 0) -> None:
        self._server = QuietServer(("127.0.0.1", port), handler)
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), name=name, daemon=True)
        self.port = self._server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.closing()
        self._server.shutdown()
        self._server.server_close()

    async def __aenter__(self) -> Self:
        return self.__enter__()

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.to_thread(self.__exit__, *exc)

    def serve(self) -> None:
        """Serve in this thread until the process ends (a child process's main loop)."""
        self._server.serve_forever()

    def closing(self) -> None:
        """What to let go before the server stops (a request it holds)."""
