"""The chat service the UI talks to: one chat turn from the typed text to the recorded reply.

`ChatService.reply(session, text)` does the whole turn: clean the message, wait for the engine, route it to a
template and fit the conversation into the context window, stream the reply through the one client, record it
(metrics, the session's history). It yields events (backend.chat.turn) that the UI renders, and decides nothing
the UI would have to know. `ChatService.answer(user, session, text)` is the same turn within the user's quota
(backend.chat.quota): what the page asks.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from contextlib import aclosing
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

from backend.chat.admission import Admission, Ticket
from backend.chat.client import ChatClient, Message
from backend.chat.context import Accounting, Counts, Fitted, Frame, estimate_tokens, fit, head_of
from backend.chat.decision import Decision, decide
from backend.chat.pacing import paced
from backend.chat.quota import ChatQuota
from backend.chat.request import SETTING_KEYS, ChatRequest, UserSettings, clean_input
from backend.chat.saved import asked_ids, counts_from_thread, history_from_thread, notices
from backend.chat.sources import Finder, Source, with_sources, within
from backend.chat.turn import (
    ChatSession,
    Done,
    Ending,
    EngineState,
    EngineWait,
    Event,
    Notice,
    Queued,
    Refused,
    Serving,
    Started,
    Text,
)
from backend.config import AppConfig, load_config
from backend.engines.base import Endpoint
from backend.engines.registry import configured_engine, dialect, engine
from backend.errors import InvalidInputError, Phrase, PromptTooLongError, ServerFullError, ServiceError
from backend.models.prompt_ids import verified
from backend.models.resolve import DEMO_NAME
from backend.prompts.store import Templates, TemplateStore
from backend.serving.hardware import gpu_label
from backend.serving.launch import Chooser, make_supervisor
from backend.serving.supervisor import State, Supervisor

log = logging.getLogger(__name__)

MIN_REPLY_TOKENS = 64
WAIT_STEP_S = 1.0  # how often the "starting" notice is updated
UNLINED_PLACES = 1_000_000  # replies at once to a server that queues itself: no bound of ours
# The warm-up (ChatService.warm_up): a first message, a short reply to it; on a GPU also a long prompt beside
# a few short ones.
WARMUP_TEXT = "Hello! Who are you?"
WARMUP_REPLY_TOKENS = 4
WARMUP_LONG_TOKENS = 2048
WARMUP_AT_ONCE = 4


class Recorder(Protocol):
    """Where the service records what happened (the app's metrics, backend.ops.metrics.AppMetrics)."""

    def record_error(self, error: BaseException | str) -> str: ...

    def turn_finished(self, done: Done) -> None: ...

    def request_finished(self, route: str, outcome: str, prompt_tokens: int, reply_tokens: int) -> None: ...


class NoRecorder:
    """Records nothing (a service built without metrics: scripts, tests)."""

    def record_error(self, error: BaseException | str) -> str:
        return ""

    def turn_finished(self, done: Done) -> None:
        return None

    def request_finished(self, route: str, outcome: str, prompt_tokens: int, reply_tokens: int) -> None:
        return None


class ChatService:
    """Owns the engine supervisor, the single streaming client and the prompt templates; runs chat turns."""

    def __init__(
        self,
        cfg: AppConfig,
        supervisor: Supervisor,
        client: ChatClient,
        templates: TemplateStore,
        recorder: Recorder | None = None,
    ):
        self.cfg = cfg
        self.supervisor = supervisor
        self.client = client
        self.templates = templates
        self.recorder: Recorder = recorder or NoRecorder()
        self._max_model_len: int | None = None
        self._accounting: tuple[str, Accounting] | None = None  # the counts' model and engine, and the accounting
        self._estimating = False  # the engine cannot count: the counts are estimates (estimate_tokens)
        a = cfg.admission
        # The line in front of the engine; its places are the running engine's (LaunchSpec.capacity: line()).
        self.admission = Admission(1, a.queue_max, a.max_wait_s, a.reply_s) if a.enabled else None
        # Replies to a server that queues itself (no line: line() is None) hold a place here, never waiting: counted,
        # so that a drain for a restart waits for them too and refuses newcomers as the line does.
        self.unlined = Admission(UNLINED_PLACES, a.queue_max, a.max_wait_s, a.reply_s) if a.enabled else None
        self.finder: Finder | None = None  # the users' documents (backend.documents.library), when the app has them
        # The users' quotas, shared with their API requests (its store set by the app once the database is open).
        self.quota = ChatQuota(None, self.recorder.request_finished)

    @classmethod
    def from_config(
        cls, cfg: AppConfig | None = None, recorder: Recorder | None = None, choose: Chooser | None = None
    ) -> ChatService:
        """Build the service; nothing starts until start(). `choose` decides the engine first (the tune)."""
        cfg = cfg or load_config()
        supervisor = make_supervisor(cfg, choose)
        client = ChatClient(
            supervisor.endpoint,
            connect_timeout_s=cfg.timeouts.connect_s,
            read_timeout_s=cfg.timeouts.read_s,
            retries=cfg.restart.request_retries,
        )
        templates = TemplateStore(cfg.paths.resolve(cfg.paths.prompts_dir))
        service = cls(cfg, supervisor, client, templates, recorder)
        supervisor.warm_up = service.warm_up
        supervisor.last_token = lambda: client.last_token_at
        return service

    def with_templates(self, templates: TemplateStore) -> ChatService:
        """This service with other templates (the workshop's drafts): the same engine, client and token accounting
        (the template's fixed parts are not measured again); it records nothing."""
        view = ChatService(self.cfg, self.supervisor, self.client, templates, NoRecorder())
        view._accounting = (self.counter_id(), self.accounting())
        view._max_model_len = self._max_model_len
        view.admission = self.admission  # a try waits in the same line as the chat
        view.unlined = self.unlined
        view.finder = self.finder
        return view

    # ----- life cycle -------------------------------------------------------------------------
    @property
    def endpoint(self) -> Endpoint:
        return self.client.endpoint

    @property
    def serving_demo(self) -> bool:
        """Whether the offline demo model answers (known once the engine's model is resolved): the demo the engine
        fell back to, or an external server whose configured model is the demo model (model.id names it)."""
        spec = self.supervisor.spec
        if spec is None:
            return False
        external_demo = not engine(spec.engine).spawns and Path(self.cfg.model.id.rstrip("/")).name == DEMO_NAME
        return spec.demo or external_demo

    @property
    def demo_note(self) -> Phrase | None:
        """Why the demo model answers, while it does (for the chat's first notice, in the reader's language): the
        engine's fall-back to it (the only one: the hub out of reach, backend.models.resolve), the server the app uses
        serving it, or the configuration naming it."""
        spec = self.supervisor.spec
        if not self.serving_demo or spec is None:
            return None
        if self.supervisor.status.note:
            return Phrase("demo.hub", model=self.cfg.model.id, demo=DEMO_NAME)
        return Phrase("demo.named" if engine(spec.engine).spawns else "demo.server", demo=DEMO_NAME)

    def serving(self) -> Serving:
        """Which model, engine and device answer (or will: the configured ones until the engine is resolved)."""
        spec, st = self.supervisor.spec, self.supervisor.status
        chosen = engine(spec.engine) if spec is not None else configured_engine(self.cfg)  # None: auto, not yet known
        model = DEMO_NAME if self.serving_demo else Path(self.cfg.model.id.rstrip("/")).name
        device = ""
        if chosen is not None and chosen.spawns:
            device = gpu_label(self.supervisor.gpus) if chosen.on_gpu else "CPU"
        name = chosen.name if chosen is not None else ""
        return Serving(model, name, device, st.state.value, st.elapsed_s, self.serving_demo, st.progress)

    def start(self) -> None:
        """Start the engine in the background (the chat says 'starting' until it is ready)."""
        self.supervisor.start_background()

    async def stop(self) -> None:
        await self.supervisor.stop()
        await self.client.aclose()

    def new_session(self) -> ChatSession:
        """A chat's state at its start: the default settings (the demo model's while it answers)."""
        return ChatSession(UserSettings.defaults(self.cfg, self.serving_demo))

    def resumed_session(
        self,
        history: list[Message],
        saved_settings: dict[str, Any],
        turn_ids: list[str] | None = None,
        counts: tuple[Counts, str] | None = None,
        told: set[str] | None = None,
    ) -> ChatSession:
        """A saved chat's state: its history, the ids of the messages that asked its latest turns, its settings,
        the counts kept with its turns and the model and engine that counted them, the notices it was told."""
        session = self.new_session()
        session.demo_told = "demo" in (told or set())
        session.history = history
        session.tokens, session.counted_by = counts or ([], "")
        session.turn_ids = (turn_ids or [])[-(len(history) // 2) :] if len(history) >= 2 else []
        session.settings.update(saved_settings, self.cfg, self.serving_demo)
        return session

    def thread_session(
        self, thread: Mapping[str, Any], saved_settings: dict[str, Any], steps: list[dict[str, Any]]
    ) -> ChatSession:
        """A saved thread's chat: its history and counts from the thread, what asked its turns and what it was told
        from `steps` (the steps the page shows: a reply still being written is left out)."""
        history, counts = history_from_thread(thread), counts_from_thread(thread)
        return self.resumed_session(history, saved_settings, asked_ids(steps), counts, notices(steps))

    def update_settings(self, session: ChatSession, values: dict[str, Any]) -> dict[str, Any]:
        """Apply the settings panel's values; return those that changed (key -> new value; template None is auto)."""
        keys = (*SETTING_KEYS, "template")
        before = {key: getattr(session.settings, key) for key in keys}
        session.settings.update(values, self.cfg, self.serving_demo)
        return {key: getattr(session.settings, key) for key in keys if getattr(session.settings, key) != before[key]}

    def describe(self, template: str) -> str:
        """A template's description ("" for one that is gone)."""
        return dict(self.templates.describe()).get(template, "")

    def template_news(self, session: ChatSession, templates: Templates | None = None) -> Notice | None:
        """The templates' problems, when they changed since this chat was last told (once per change)."""
        found = self.templates.snapshot() if templates is None else templates
        problems = [str(p) for p in found.problems]
        news = problems and problems != session.template_problems
        session.template_problems = problems
        return Notice("template_problems", items=tuple(problems)) if news else None

    # ----- one turn ---------------------------------------------------------------------------
    def answer(
        self, user: str | None, session: ChatSession, text: str, command: str | None = None, message_id: str = ""
    ) -> AsyncGenerator[Event, None]:
        """One chat turn of `user` (None: no login, no quota) within their quota: reply()'s events, or Refused over a
        quota; its tokens are counted against the quota as it ends."""
        return self.quota.turn(user, self.reply(session, text, command, message_id))

    async def reply(
        self, session: ChatSession, text: str, command: str | None = None, message_id: str = ""
    ) -> AsyncIterator[Event]:
        """One chat turn: clean → wait for the engine → build the request → stream → record. Yields its events.

        `command` is a template picked in the chat's / menu for this message. A message that already asked a turn
        (`message_id`: edited, or its reply asked again) first drops that turn and the later ones: the model sees
        the conversation as the page now shows it."""
        session.forget_from(message_id)
        try:
            text = clean_input(text, self.cfg.chat.max_input_chars)
        except InvalidInputError as exc:
            yield Refused(exc)
            return
        # The template folder, read once for the turn and off the event loop (a stat per file, a changed one read).
        templates = await asyncio.to_thread(self.templates.snapshot)
        news = self.template_news(session, templates)
        if news is not None:
            yield news
        waited: EngineWait | None = None
        async for waited in self.wait_for_engine():
            yield waited
        if waited is not None and waited.state != "ready":
            self.recorder.record_error("unavailable")
            return
        if self.serving_demo and not session.demo_told:  # known once the engine is resolved: told at the first turn
            session.demo_told = True
            yield Notice("demo", {"note": self.demo_note or ""})
        if session.counted_by != self.counter_id():  # counts of another model or engine: counted again, once
            session.tokens, session.counted_by = [], self.counter_id()
        try:
            request = await self.build_request(
                session.history, text, session.settings, command, session.kept_tokens(), templates=templates,
                left_out=session.left_out, owner=session.owner,
            )  # fmt: skip
        except ServiceError as exc:
            self.recorder.record_error(exc)
            yield Refused(exc)
            return
        session.tokens = list(request.history_tokens)  # those counted now are kept (a stop or a failure included)
        session.left_out = request.dropped  # kept out while the rest fits: the engine's cache of the rest stays good
        if request.dropped:
            yield Notice("trimmed", {"dropped": request.dropped})
        try:
            ticket = self.join_line(session.line_owner)
        except ServerFullError as exc:
            self.recorder.record_error(exc)
            yield Refused(exc)
            return
        try:
            if ticket is not None:
                try:
                    async with aclosing(self.wait_in_line(ticket)) as places:
                        async for place in places:
                            yield place
                except ServerFullError as exc:  # the app drains for a restart
                    self.recorder.record_error(exc)
                    yield Refused(exc)
                    return
            # The stream and its yields in one generator: the stop button cancels the task that runs the turn
            # (backend.chat.live), which awaits nothing but this generator, so the stop lands in the stream below.
            parts: list[str] = []
            ending: Ending = "finished"
            error: ServiceError | None = None
            stream = self.client.stream(request.messages, **request.sampling)
            yield Started(request.user_text)
            try:
                # Closed here, in this task, whatever ends the reply: left to the garbage collector, the HTTP stream
                # would be closed outside any task ("Attempted to exit cancel scope in a different task").
                async with stream, aclosing(paced(stream, self.cfg.chat.stream_flush_ms / 1000)) as pieces:
                    async for piece in pieces:
                        parts.append(piece)
                        yield Text(piece)
            except asyncio.CancelledError:
                # The stop button: the stream is closed above (the engine aborts the request); keep what arrived.
                ending = "stopped"
            except ServiceError as exc:
                log.warning("Reply failed: %s", exc)
                error, ending = exc, ("interrupted" if parts else "failed")
            text = "".join(parts)
            reply_count: int | None = None  # a reply that did not finish: counted with its turn at the next message
            if text and ending == "finished":
                request, reply_count = await self._count_turn(request, text)
            self._correct(session, request, stream.stats.prompt_tokens)
            tokens: tuple[int | None, int | None] = (None, None)
            if text:
                tokens = (request.user_tokens, reply_count)
                session.add_turn(request.user_text, text, message_id, tokens)
            done = Done(
                text,
                request.template,
                request.reason,
                request.user_text,
                ending,
                error,
                stream.stats,
                request.prompt_tokens,
                tokens,
                session.counted_by,
                tuple(request.sources),
            )
            self.recorder.turn_finished(done)  # the one record of the turn in the metrics
            yield done
        finally:
            if ticket is not None:
                ticket.leave()

    # ----- the line in front of the engine ------------------------------------------------------------------------
    def line(self) -> Admission | None:
        """The line in front of the engine that serves now, its places the engine's (None: no line: admission off,
        or a server that queues itself, or none known yet)."""
        spec = self.supervisor.spec
        if self.admission is None or spec is None or spec.capacity is None:
            return None
        self.admission.resize(spec.capacity)
        return self.admission

    def lines(self) -> list[Admission]:
        """Every place a request may hold: the line in front of the engine, and the places of replies without one."""
        return [line for line in (self.admission, self.unlined) if line is not None]

    def join_line(self, owner: str) -> Ticket | None:
        """A place in the line for one request of `owner` (a place of its own where the server queues itself; None:
        admission off); ServerFullError when the line is full, ServerRestartingError while the app drains."""
        line = self.line() or self.unlined
        return line.join(owner) if line is not None else None

    async def wait_in_line(self, ticket: Ticket) -> AsyncGenerator[Queued, None]:
        """Nothing when `ticket` runs at once; else its place and expected wait every second until it runs, then
        how long it waited. ServerRestartingError when the app drains meanwhile."""
        started = time.monotonic()
        waited = False
        while not await ticket.wait(WAIT_STEP_S if waited else 0.0):
            waited = True
            line = ticket.admission
            late = time.monotonic() - started > line.max_wait_s
            yield Queued(ticket.place, ticket.expected_s if line.measured else None, late)
        if waited:
            yield Queued(0, time.monotonic() - started)

    def restarting(self) -> ServerFullError | None:
        """Why nothing new is taken in while the app drains for a restart (None: it is not draining)."""
        return self.admission.refusal if self.admission is not None else None

    async def admit(self, owner: str) -> Ticket | None:
        """Wait in line for one request of `owner` (the API's: it shows no place); None: admission off. Leave the ticket
        when the request ends. ServerFullError when the line is full or the app drains."""
        ticket = self.join_line(owner)
        if ticket is not None:
            try:
                await ticket.wait()
            except BaseException:
                ticket.leave()
                raise
        return ticket

    async def _count_turn(self, request: ChatRequest, reply: str) -> tuple[ChatRequest, int | None]:
        """A finished reply counted with its message, after it (off the path to the first text), so every kept count
        is exact (backend.chat.context): the engine's usage figure cannot stand for it, since the tokens a model
        generated need not be the tokens its text is read as in the next prompt. A message sent uncounted (far
        within the window) is counted now too, beside it. Where a count fails, what it was for stays uncounted
        (counted with its turn at the next message, once). Returns the request with exact counts and the reply's."""
        head = [m for m in request.messages[:1] if m["role"] == "system"]
        answered = [*head, request.messages[-1], {"role": "assistant", "content": reply}]
        count = self.accounting().count
        try:
            if request.uncounted is None:
                alone, turn = request.frame.overhead + (request.user_tokens or 0), await count(answered)
            else:
                alone, turn = await asyncio.gather(count(request.uncounted), count(answered))
        except ServiceError as exc:
            log.info("The finished reply could not be counted: %s", exc)
            return (request if request.uncounted is None else replace(request, user_tokens=None)), None
        reply_count = max(0, turn - alone)
        if request.uncounted is None:
            return request, reply_count
        bound = request.prompt_tokens - sum(request.history_tokens[request.dropped :])  # overhead + upper_bound
        exact = request.prompt_tokens - bound + alone
        counted = replace(request, prompt_tokens=exact, user_tokens=alone - request.frame.overhead, uncounted=None)
        return counted, reply_count

    def _correct(self, session: ChatSession, request: ChatRequest, prompt_tokens: int | None) -> None:
        """Make the kept counts agree with the engine's own count of the prompt it was sent (its usage figure).

        Every kept count is exact where the template is additive (each message rendered on its own); where it is
        not, the difference goes to the newest reply, so the next fit is exact on the counts the engine itself
        reported. (An engine that cannot count gets conservative estimates throughout, left as they are.)"""
        kept = len(request.history_tokens) - request.dropped
        uncounted = request.uncounted is not None  # its prompt_tokens is an upper bound: nothing to correct by
        if (
            prompt_tokens is None
            or kept <= 0
            or prompt_tokens == request.prompt_tokens
            or self._estimating
            or uncounted
        ):
            return
        if len(session.tokens) != len(request.history_tokens):
            return  # the history changed meanwhile (an edit): nothing to correct
        newest = session.tokens[-1] or 0
        session.tokens[-1] = max(0, newest + prompt_tokens - request.prompt_tokens)
        log.debug("Kept count of the newest reply corrected by %d tokens", prompt_tokens - request.prompt_tokens)

    async def warm_up(self) -> None:
        """Before the engine is called ready (the supervisor calls this): a chat's first message once through the
        chat's own path (the context window, the template's fixed parts and the message counted, a short streamed
        reply), and on a GPU a long prompt beside a few short ones, so that the shapes an engine compiles at first
        use are compiled before a user waits on them. What it measures is kept (the fixed parts, the window)."""
        await self.use_prompt_ids()
        settings = UserSettings.defaults(self.cfg, self.serving_demo)
        request = await self.build_request([], WARMUP_TEXT, settings)
        await self._drain(request.messages, request.sampling)
        spec = self.supervisor.spec
        if spec is None or not engine(spec.engine).on_gpu:
            return
        long_text = " ".join(["word"] * min(WARMUP_LONG_TOKENS, await self.context_window() // 2))
        long = [{"role": "user", "content": long_text}]
        await asyncio.gather(
            self._drain(long, request.sampling),
            *(self._drain(request.messages, request.sampling) for _ in range(WARMUP_AT_ONCE)),
        )

    async def use_prompt_ids(self) -> bool:
        """Send prompts as the model's token ids, made here (backend.models.prompt_ids), where the engine takes them
        (its dialect), chat.token_ids allows (auto: an engine on a GPU), the model folder is here, and they equal the
        engine's own rendering of the sample conversations; else (or until then) as messages. Whether they are."""
        self.client.prompt_ids = None
        spec, mode = self.supervisor.spec, self.cfg.chat.token_ids
        if mode == "never" or spec is None or spec.weights is None or not dialect(self.endpoint.api).takes_ids:
            return False
        if mode == "auto" and not engine(spec.engine).on_gpu:
            return False
        made = await verified(Path(spec.weights.model), self.client.engine_ids)
        if made is None:
            return False
        self.client.prompt_ids = made
        log.info("Prompts go to the engine as token ids (the chat template and tokenizer of %s).", made.folder)
        return True

    async def _drain(self, messages: list[Message], sampling: dict[str, Any]) -> None:
        async with self.client.stream(messages, **{**sampling, "max_tokens": WARMUP_REPLY_TOKENS}) as stream:
            async for _ in stream:
                pass

    async def wait_for_engine(self) -> AsyncIterator[EngineWait]:
        """Nothing when the engine is ready; else its state every second until it is ready, failed or too slow.

        One clock: the seconds shown are the engine's, from when it began to start (or restart) as this message
        first saw it, up to the moment it became ready; the wait's limit counts from the message."""
        sup = self.supervisor
        if sup.ready:
            return
        sup.request_retry()
        started = time.monotonic()
        origin: float | None = None  # when the engine began the start this message waits for
        while not await sup.wait_ready(WAIT_STEP_S):
            st = sup.status
            waited = time.monotonic() - started
            if st.state in (State.FAILED, State.STOPPED):
                tail = "" if self.cfg.auth.enabled else st.log_tail  # with login on, the log is the admins' to read
                yield EngineWait("failed", waited, st.problem, tail, sup.log_path)
                return
            if waited > self.cfg.timeouts.wait_for_ready_s:
                yield EngineWait("not_ready", waited)
                return
            origin = st.since if origin is None else min(origin, st.since)
            state: EngineState = "restarting" if st.state == State.RESTARTING else "starting"
            problem = st.problem if state == "restarting" else None
            yield EngineWait(state, time.monotonic() - origin, problem, progress=st.progress)
        took = sup.status.since - (origin if origin is not None else started)
        yield EngineWait("ready", max(took, 0.0), warmup_s=sup.status.warmup_s)

    # ----- building the request ---------------------------------------------------------------
    async def context_window(self) -> int:
        """The model's context length as the server reports it (cached), or the configured one."""
        if self._max_model_len is None:
            reported = await self.client.max_model_len()
            self._max_model_len = reported or self.supervisor.flags.max_model_len or 4096
        return self._max_model_len

    async def _count(self, messages: list[Message]) -> int:
        counted = await self.client.count_tokens(messages)
        self._estimating = counted is None
        return counted if counted is not None else estimate_tokens(messages)

    def counter_id(self) -> str:
        """The model and engine that count the tokens (kept counts of another pair are counted again)."""
        spec = self.supervisor.spec
        model = DEMO_NAME if self.serving_demo else Path(self.cfg.model.id.rstrip("/")).name
        return f"{model}@{spec.engine if spec is not None else ''}"

    def accounting(self) -> Accounting:
        """The token accounting of the model and engine that serve now (the template's fixed parts, kept)."""
        key = self.counter_id()
        if self._accounting is None or self._accounting[0] != key:
            self._accounting = (key, Accounting(self._count))
            self.client.forget_templates()
        return self._accounting[1]

    def decide(
        self,
        text: str,
        settings: UserSettings,
        command: str | None = None,
        templates: Templates | None = None,
        commands: bool = True,
    ) -> Decision:
        """Which template, system text and sampling `text` is sent with, and why, on the model that serves now
        (backend.chat.decision: the workshop's preview and try ask the same); `templates`: the turn's snapshot;
        `commands` off: a message that begins with "/" is no command (the API)."""
        found = self.templates.snapshot() if templates is None else templates
        return decide(found, self.cfg, text, settings, self.serving_demo, command, commands)

    async def build_request(
        self,
        history: list[Message],
        text: str,
        settings: UserSettings,
        command: str | None = None,
        kept: Counts | None = None,
        system: str | None = None,
        templates: Templates | None = None,
        left_out: int | None = None,
        commands: bool = True,
        owner: str | None = None,
    ) -> ChatRequest:
        """Decide how the message is sent (decide) and fit the conversation into the context window: one count of
        the new message, the history's from `kept` (those missing are counted once; backend.chat.context). With
        `kept` None (a caller that sends the whole conversation each time: the API), one count of the whole prompt,
        and the turns one by one only where it does not fit.

        `system`: a system text of the caller's own (the API's) in place of the template's; `templates`: the turn's
        snapshot of the template folder (None: read now). `left_out`: a chat's own conversation (ChatSession.left_out,
        the oldest messages an earlier message's fit left out): those stay out while the rest fits, a trim goes down
        to `chat.trim_to` of the room, and far within the window the new message goes uncounted (ChatRequest.
        uncounted; the chat counts it after the reply: _count_turn). None (the API, the workshop): counted first,
        the longest part that fits. `commands` off: a message that begins with "/" is no command (the API). `owner`:
        whose documents the message is answered from (backend.chat.sources)."""
        decision = self.decide(text, settings, command, templates, commands)
        sampling = dict(decision.sampling)
        system = decision.system if system is None else system
        window = await self.context_window()
        reserve = min(int(sampling["max_tokens"]), window // 2)
        sources = await self.sources(owner, decision.question, decision.passages, window - reserve)
        new = {"role": "user", "content": with_sources(decision.user, sources)}
        accounting = self.accounting()
        fitted: Fitted | None = None
        frame = Frame(0)
        if kept is None and history:  # nothing kept (the API): one count of the whole prompt, where it fits
            fitted = await accounting.fit_whole(history, new, window - reserve, system)
        if fitted is None:
            chat = left_out is not None
            start, trim_to = (left_out or 0, self.cfg.chat.trim_to) if chat else (0, 1.0)
            budget = (window - reserve) if chat else None
            measured = await accounting.measure(history, kept or [], new, system, budget, start)
            frame = measured.frame
            try:
                fitted = fit(history, new, measured, window - reserve, system, start, trim_to)
            except PromptTooLongError as exc:
                # A long message still goes through with a shorter reply, as long as some reply fits.
                least = min(MIN_REPLY_TOKENS, reserve)
                if int(str(exc.params.get("tokens", window))) > window - least:
                    raise
                fitted = fit(history, new, measured, window - least, system, start, trim_to)
        sampling["max_tokens"] = max(1, min(int(sampling["max_tokens"]), window - fitted.prompt_tokens))
        return ChatRequest(
            messages=fitted.messages,
            sampling=sampling,
            template=decision.template,
            reason=decision.reason,
            user_text=new["content"],
            prompt_tokens=fitted.prompt_tokens,
            dropped=fitted.dropped,
            history_tokens=fitted.tokens or [],
            frame=frame,
            user_tokens=fitted.new_tokens if fitted.exact else None,
            uncounted=None if fitted.exact else [*head_of(system), new],
            sources=sources,
        )

    async def sources(self, owner: str | None, question: str, count: int, room: int) -> list[Source]:
        """The passages of the owner's documents that answer the question, as many as fit their share of the prompt's
        `room` (documents.share): the rest of the room is the history's, fitted as before. None where the owner has
        no documents, the template sends none, or the library fails (the message goes on without them)."""
        if self.finder is None or owner is None or count <= 0:
            return []
        try:
            found = await self.finder.find(owner, question, count)
        except ServiceError as exc:
            log.warning("Documents not searched: %s", exc)
            return []
        return within(found, int(room * self.cfg.documents.share))
