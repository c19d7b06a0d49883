"""Admission in front of the engine: at most `capacity` replies run at once, the rest wait in a fair, bounded line.

Shared by the chat and the API (both reach the engine through ChatService). Fair: each user has a line of their
own and the lines are served in turns, so one user's ten requests wait behind each other, not in front of a
colleague's one. Bounded: by the number waiting (`queue_max`) and by the wait a newcomer would face
(`max_wait_s`); beyond either, a request is refused at once (ServerFullError with the seconds after which a place
is expected to be free). A waiting request knows its place and its expected wait, updated as the line moves, and
leaves the line when it is cancelled (the stop button, a closed connection). While the app drains for a restart
(close()), newcomers and those still waiting are refused with ServerRestartingError.

The expected wait: the request at place n runs once n places have been freed, so it waits about n x `place_s`, the
seconds between two places freed while every place is taken. `place_s` is measured as the line moves: over the last
places freed (two for each place: the replies running now and those before them), the seconds during which every place
was taken divided by the places freed in them (a reply's time at its place would mislead: replies lengthen as chats
grow, and the short ones free places more often than their mean suggests). The current gap counts too once it is longer
than those measured, so a line that stops moving (an engine slowed down) shows a growing wait. Until MEASURED places
have been freed (`measured`), `place_s` is `reply_s` / capacity (the configured figure, then a moving average of the
replies' times at their places), a guess kept for the bound: the chat shows no expected wait made of it.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field

from backend.errors import ServerFullError, ServerRestartingError

SMOOTHING = 0.2  # weight of the newest reply in the moving average of reply_s
# The places freed, most recent, whose gaps give place_s: two per place, at least 8. In a simulated crowd (8 places,
# replies that lengthen as chats grow) 16 kept 9 in 10 estimates within half the wait, and, after a crowd of long
# chats gave way to one of short chats, 8 in 10 where a window of 32 kept 7 in 10
# (results/load/crowd-estimate/estimate_sim.py).
WINDOW_PER_PLACE, MIN_WINDOW = 2, 8
MEASURED = 4  # places freed before place_s is measured rather than taken from reply_s


@dataclass(eq=False)
class Ticket:
    """One request's place: waiting in its user's line, then running (holding one of the engine's places)."""

    user: str
    admission: Admission
    joined: float
    started: float | None = None
    done: bool = False
    _event: asyncio.Event = field(default_factory=asyncio.Event)
    _refusal: Exception | None = None

    @property
    def running(self) -> bool:
        return self.started is not None and not self.done

    @property
    def place(self) -> int:
        """1 for the next to run; 0 once running."""
        return self.admission.place_of(self)

    @property
    def expected_s(self) -> float:
        """The expected seconds until this request runs (0 once running)."""
        return self.admission.expected_wait_s(self.place)

    async def wait(self, timeout_s: float | None = None) -> bool:
        """Wait until this request may run (True) or `timeout_s` passes (False); raise the refusal when the app
        drains for a restart."""
        if not self.running:
            try:
                await asyncio.wait_for(self._event.wait(), timeout_s)
            except TimeoutError:
                return False
        if self._refusal is not None:
            raise self._refusal
        return True

    def leave(self) -> None:
        """Give the place back (running) or leave the line (waiting); the next request in turn runs."""
        self.admission.leave(self)


class Admission:
    """At most `capacity` requests running, the rest in fair lines; see the module docstring."""

    def __init__(
        self,
        capacity: int,
        queue_max: int,
        max_wait_s: float,
        reply_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.capacity = capacity
        self.queue_max = queue_max
        self.max_wait_s = max_wait_s
        self.reply_s = reply_s
        self.clock = clock
        self.running: set[Ticket] = set()
        self._lines: OrderedDict[str, deque[Ticket]] = OrderedDict()  # user -> their waiting requests, in turn order
        self._closed: ServerRestartingError | None = None
        self.refused = 0  # requests refused because the line was full (for the metrics)
        self._idle = asyncio.Event()  # set when the last running request leaves (drained())
        self._full_s = 0.0  # seconds during which every place was taken, summed
        self._full_since: float | None = None  # every place taken since then (None: a place is free)
        self._freed = self._window()  # _full_s at each place freed while every place was taken

    def resize(self, capacity: int) -> None:
        """The engine's places changed (another engine or configuration serves): more may run at once now."""
        if capacity != self.capacity and capacity >= 1:
            self.capacity = capacity
            self._freed = self._window()  # the line moves at another pace now
            self._admit()
            self._note_full()

    # ----- the line --------------------------------------------------------------------------------------------
    @property
    def waiting(self) -> int:
        return sum(len(line) for line in self._lines.values())

    def order(self) -> list[Ticket]:
        """The waiting requests in the order they will run: the users in turn, each user's own oldest first."""
        lines = [list(line) for line in self._lines.values()]
        out: list[Ticket] = []
        for depth in range(max((len(line) for line in lines), default=0)):
            out.extend(line[depth] for line in lines if depth < len(line))
        return out

    def place_of(self, ticket: Ticket) -> int:
        if ticket.running or ticket.done:
            return 0
        return self.order().index(ticket) + 1

    def _window(self) -> deque[float]:
        return deque(maxlen=max(MIN_WINDOW, WINDOW_PER_PLACE * self.capacity))

    @property
    def measured(self) -> bool:
        """Whether the line has moved enough here for its expected waits to be measured ones (module docstring)."""
        return len(self._freed) >= MEASURED

    @property
    def place_s(self) -> float:
        """The expected seconds between two places freed while every place is taken (module docstring)."""
        prior = self.reply_s / self.capacity
        if not self.measured:
            return prior
        full_s = self._full_s + (self.clock() - self._full_since if self._full_since is not None else 0.0)
        first, last = self._freed[0], self._freed[-1]
        gaps = len(self._freed) - 1
        measured = (last - first) / gaps
        return max(measured, (full_s - first) / (gaps + 1), 1e-3)

    def expected_wait_s(self, place: int) -> float:
        """The expected seconds until the request at `place` runs (0: running)."""
        if place <= 0:
            return 0.0
        return place * self.place_s

    def join(self, user: str) -> Ticket:
        """A ticket for one request of `user`: running at once where a place is free and nobody waits, else
        waiting in line; ServerFullError where the line is full (by count or expected wait); ServerRestartingError
        while the app drains."""
        if self._closed is not None:
            raise self._closed
        ticket = Ticket(user, self, self.clock())
        if len(self.running) < self.capacity and not self.waiting:
            self._start(ticket)
            return ticket
        # Where a newcomer of this user would stand: behind everyone in a line no longer than theirs (turns).
        own = len(self._lines.get(user, ()))
        place = sum(min(len(line), own + 1) for name, line in self._lines.items() if name != user) + own + 1
        place_s = self.place_s
        expected = place * place_s
        if self.waiting >= self.queue_max or expected > self.max_wait_s:
            self.refused += 1
            over = max(1, place - math.floor(self.max_wait_s / place_s))
            retry = max(1, math.ceil(min(expected, over * place_s)))
            raise ServerFullError.of("admission.full", waiting=self.waiting, retry_s=retry)
        self._lines.setdefault(user, deque()).append(ticket)
        return ticket

    def leave(self, ticket: Ticket) -> None:
        if ticket.done:
            return
        ticket.done = True
        if ticket in self.running:
            if self._full_since is not None:  # a place freed while every place was taken: the line moves
                self._freed.append(self._full_s + self.clock() - self._full_since)
            self.running.discard(ticket)
            if ticket.started is not None:
                held = self.clock() - ticket.started
                self.reply_s = (1 - SMOOTHING) * self.reply_s + SMOOTHING * max(held, 0.01)
            if not self.running:
                self._idle.set()
        else:
            line = self._lines.get(ticket.user)
            if line is not None and ticket in line:
                line.remove(ticket)
                if not line:
                    del self._lines[ticket.user]
        self._admit()
        self._note_full()

    def _note_full(self) -> None:
        """Keep the seconds during which every place was taken (place_s)."""
        full = len(self.running) >= self.capacity
        if full and self._full_since is None:
            self._full_since = self.clock()
        elif not full and self._full_since is not None:
            self._full_s += self.clock() - self._full_since
            self._full_since = None

    def _start(self, ticket: Ticket) -> None:
        ticket.started = self.clock()
        self.running.add(ticket)
        ticket._event.set()
        self._note_full()

    def _admit(self) -> None:
        """Start the next requests in turn while places are free: the first user's oldest, then that user goes to
        the end of the turn order."""
        while len(self.running) < self.capacity and self._lines:
            user, line = next(iter(self._lines.items()))
            ticket = line.popleft()
            del self._lines[user]
            if line:
                self._lines[user] = line  # back in turn, at the end
            self._start(ticket)

    # ----- a restart -------------------------------------------------------------------------------------------
    def close(self, seconds: int) -> None:
        """The app drains for a restart: refuse newcomers and everyone still waiting (back in about `seconds`)."""
        self._closed = ServerRestartingError.of("admission.restarting", retry_s=max(1, seconds))
        for ticket in self.order():
            ticket._refusal = self._closed
            ticket.done = True
            ticket._event.set()
        self._lines.clear()

    @property
    def closed(self) -> bool:
        return self._closed is not None

    @property
    def refusal(self) -> ServerRestartingError | None:
        """What newcomers are told while the app drains (None: it does not)."""
        return self._closed

    async def drained(self, timeout_s: float) -> bool:
        """Wait until no request runs (True) or `timeout_s` passes (False)."""
        if self.running:
            self._idle.clear()
            try:
                await asyncio.wait_for(self._idle.wait(), timeout_s)
            except TimeoutError:
                return False
        return True
