"""A local HTTP server served from a thread while a test's `with` lasts: the base of the in-process stand-ins
(tests/app_process.FakeEngine and RecordingProxy, the answer check's stub servers)."""

from __future__ import annotations

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
    """`handler` on a port the OS picks, from `with` to its end."""

    def __init__(self, handler: type[BaseHTTPRequestHandler], name: str) -> None:
        self._server = QuietServer(("127.0.0.1", 0), handler)
        self._thread = threading.Thread(target=self._server.serve_forever, name=name, daemon=True)
        self.port = self._server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.closing()
        self._server.shutdown()
        self._server.server_close()

    def closing(self) -> None:
        """What to let go before the server stops (a request it holds)."""
