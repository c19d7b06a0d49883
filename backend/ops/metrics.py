"""The app's Prometheus metrics: engine state and restarts, open chats, TTFT and reply time as the app sees
them, replies by outcome and errors by kind. They live in their own registry (never the process-wide
default one), so a reload or a test never registers a name twice. backend.web.hooks calls the module functions; the
chat service records each turn once as it ends (turn_finished), the API each request (request_finished)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Enum, Gauge, Histogram, generate_latest

from backend.chat.client import StreamStats
from backend.chat.turn import Done, Ending
from backend.errors import ServiceError
from backend.serving.supervisor import State, Status, Supervisor

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
TTFT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120)
REPLY_BUCKETS = (0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600)


# Codes that say more than their error's type: how talking to the engine failed (backend.chat.client's errors).
CODE_KINDS = {"backend.timeout": "timeout", "backend.broken": "connection", "backend.broken_external": "connection"}


def error_kind(error: BaseException | str) -> str:
    """A short label for an error, read from it: its code where that says more, else its type's key."""
    if isinstance(error, str):
        return error
    if isinstance(error, ServiceError):
        return CODE_KINDS.get(error.code or "") or error.key.removeprefix("error.").replace(".", "_")
    return "internal"


class AppMetrics:
    """One registry with the app's metrics and the calls that update them."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = self.registry = registry or CollectorRegistry()
        states = [s.value for s in State]
        self.backend_state = Enum("ernie_backend_state", "State of the supervised engine", states=states, registry=r)
        self.backend_ready = Gauge("ernie_backend_ready", "1 while the engine is ready to answer", registry=r)
        self.backend_restarts = Counter("ernie_backend_restarts", "Engine restarts after it died or hung", registry=r)
        self.active_chats = Gauge("ernie_active_chats", "Chat sessions open now", registry=r)
        self.ttft = Histogram(
            "ernie_reply_ttft_seconds",
            "From sending a request to its first text, as the app sees it (retries included)",
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self.reply_time = Histogram(
            "ernie_reply_seconds", "From sending a request to the end of its reply", buckets=REPLY_BUCKETS, registry=r
        )
        self.reply_tokens = Counter("ernie_reply_tokens", "Output tokens of replies (server usage)", registry=r)
        self.replies = Counter("ernie_replies", "Replies by outcome: ok, stopped, error", ["outcome"], registry=r)
        self.errors = Counter("ernie_errors", "Errors shown in the chat, by kind", ["kind"], registry=r)
        self.feedback = Counter(
            "ernie_feedback", "Replies rated in the chat (thumbs), by rating and whether a comment came with it",
            ["rating", "comment"], registry=r,
        )  # fmt: skip
        # Chat turns and API requests: never labelled by user or key (backend.api keeps per-user usage itself).
        self.requests = Counter(
            "ernie_requests", "Chat turns and API requests by route (chat, api) and outcome", ["route", "outcome"],
            registry=r,
        )  # fmt: skip
        self.usage_tokens = Counter(
            "ernie_usage_tokens", "Tokens counted against quotas, by route and kind (prompt, reply)",
            ["route", "kind"], registry=r,
        )  # fmt: skip
        self._sessions: set[str] = set()
        self._restarts_seen = 0

    def observe_status(self, status: Status) -> None:
        """Mirror the supervisor's state; count new restarts."""
        self.backend_state.state(status.state.value)
        self.backend_ready.set(1 if status.state == State.READY else 0)
        if status.restarts > self._restarts_seen:
            self.backend_restarts.inc(status.restarts - self._restarts_seen)
        self._restarts_seen = max(self._restarts_seen, status.restarts)

    def watch(self, supervisor: Supervisor) -> None:
        """Follow the supervisor's state changes from now on."""
        supervisor.on_change(self.observe_status)
        self.observe_status(supervisor.status)

    def chat_started(self, session_id: str) -> None:
        self._sessions.add(session_id)
        self.active_chats.set(len(self._sessions))

    def chat_ended(self, session_id: str) -> None:
        self._sessions.discard(session_id)
        self.active_chats.set(len(self._sessions))

    def record_error(self, error: BaseException | str) -> str:
        """Count an error the chat showed; return its kind."""
        kind = error_kind(error)
        self.errors.labels(kind=kind).inc()
        return kind

    def reply_finished(
        self, stats: StreamStats, ending: Ending = "finished", error: BaseException | None = None
    ) -> None:
        """Record one reply: its timings when it had text, and its outcome by how it ended (ok, stopped, or error:
        interrupted or failed, `error` counted by its kind)."""
        if stats.ttft_s is not None:
            self.ttft.observe(stats.ttft_s)
            if stats.finished is not None:
                self.reply_time.observe(stats.finished - stats.started)
        if stats.completion_tokens:
            self.reply_tokens.inc(stats.completion_tokens)
        if ending in ("finished", "stopped"):
            self.replies.labels(outcome="ok" if ending == "finished" else "stopped").inc()
        else:
            self.replies.labels(outcome="error").inc()
            if error is not None:
                self.record_error(error)

    def turn_finished(self, done: Done) -> None:
        """Record one chat turn that asked the engine for a reply, once: the reply (reply_finished) and the request
        with the tokens it used (request_finished, outcome the turn's ending)."""
        if done.stats is not None:
            self.reply_finished(done.stats, done.ending, done.error)
        self.request_finished("chat", done.ending, *done.counted)

    def request_finished(self, route: str, outcome: str, prompt_tokens: int, reply_tokens: int) -> None:
        """Count one chat turn or API request (backend.api's Observer) and the tokens it used."""
        self.requests.labels(route=route, outcome=outcome).inc()
        if prompt_tokens:
            self.usage_tokens.labels(route=route, kind="prompt").inc(prompt_tokens)
        if reply_tokens:
            self.usage_tokens.labels(route=route, kind="reply").inc(reply_tokens)

    def feedback_given(self, value: int, comment: str | None) -> None:
        """Count one rating of a reply: value 1 is thumbs up, 0 thumbs down (Chainlit's Feedback.value)."""
        rating = "up" if value > 0 else "down"
        self.feedback.labels(rating=rating, comment="yes" if (comment or "").strip() else "no").inc()

    def exposition(self) -> bytes:
        """The metrics in Prometheus text format."""
        return generate_latest(self.registry)


METRICS = AppMetrics()


def watch(supervisor: Supervisor) -> None:
    """Follow the supervisor's state in the app's metrics."""
    METRICS.watch(supervisor)


def chat_started(session_id: str) -> None:
    """A chat session opened."""
    METRICS.chat_started(session_id)


def chat_ended(session_id: str) -> None:
    """A chat session closed."""
    METRICS.chat_ended(session_id)


def record_error(error: BaseException | str) -> str:
    """An error reached the chat (before or instead of a reply)."""
    return METRICS.record_error(error)


def feedback_given(value: int, comment: str | None) -> None:
    """A reply was rated in the chat."""
    METRICS.feedback_given(value, comment)
