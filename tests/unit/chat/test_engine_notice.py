"""The engine notice a waiting message shows: its state and the engine's clock, in the reader's language."""

from __future__ import annotations

import pytest

from backend.chat.render import notice_text, wait_text
from backend.chat.service import ChatService
from backend.chat.turn import EngineWait, Notice
from backend.errors import BackendError, EngineStartError, Phrase
from backend.serving.supervisor import State
from tests.conftest import MakeConfig


@pytest.mark.parametrize(
    ("locale", "shown"), [("en-US", "starting (42 s so far)"), ("zh-CN", "正在启动（已用 42 秒）")]
)
def test_a_starting_engine_notice_says_how_long_it_has_been_starting(locale: str, shown: str) -> None:
    assert shown in wait_text(EngineWait("starting", 42.4), locale)
    assert shown.replace("42", "43") in wait_text(EngineWait("starting", 43.0), locale), "the number follows the clock"


@pytest.mark.parametrize(("locale", "shown"), [("en-US", "ready (97 s)"), ("zh-CN", "已就绪（用时 97 秒）")])
def test_the_ready_notice_gives_the_same_clock(locale: str, shown: str) -> None:
    assert shown in wait_text(EngineWait("ready", 97.0), locale)


@pytest.mark.parametrize(
    ("locale", "shown"), [("en-US", "ready (97 s, of which 2.5 s warming up"), ("zh-CN", "用时 97 秒，其中预热 2.5 秒")]
)
def test_the_ready_notice_says_what_the_warm_up_took(locale: str, shown: str) -> None:
    assert shown in wait_text(EngineWait("ready", 97.0, warmup_s=2.47), locale)


@pytest.mark.parametrize("locale", ["en-US", "zh-CN"])
def test_a_restarting_notice_gives_the_clock_and_the_problem(locale: str) -> None:
    problem = BackendError.of("backend.timeout")
    text = wait_text(EngineWait("restarting", 12.0, problem=problem), locale)
    assert "12" in text
    assert problem.localized(locale)[0] in text, "what went wrong, in the reader's language"


@pytest.mark.parametrize(("locale", "done"), [("en-US", "does not run it"), ("zh-CN", "不由本应用启动")])
def test_an_external_server_down_is_not_said_to_be_restarting(locale: str, done: str) -> None:
    """The app restarts its own engine; an external one (vLLM's router) it only waits for, and says so."""
    problem = EngineStartError.of(
        "engine.external_down", url="http://router:8000", reason=Phrase("reason.hung", seconds=15)
    )
    text = wait_text(EngineWait("restarting", 20.0, problem=problem), locale)
    assert done in text and "http://router:8000" in text
    assert ("restart" not in text) if locale == "en-US" else ("重启" not in text)


@pytest.mark.parametrize("login", [False, True])
async def test_the_engines_log_tail_is_shown_in_the_chat_only_without_login(
    make_config: MakeConfig, login: bool
) -> None:
    """With login on, the chat's users are not the engine's administrators: its log stays in the log file (doctor)."""
    service = ChatService.from_config(make_config(auth__enabled=str(login).lower()))
    problem = EngineStartError.of("engine.exited", exit_code=1, log="/srv/data/logs/engine.log")
    service.supervisor._set(State.STOPPED, problem=problem, log_tail="OSError: /home/admin/models/secret.gguf")
    waits = [wait async for wait in service.wait_for_engine()]
    assert [w.state for w in waits] == ["failed"]
    assert waits[0].log_tail == ("" if login else "OSError: /home/admin/models/secret.gguf")


@pytest.mark.parametrize(
    ("code", "en", "zh"),
    [
        ("demo.hub", "cannot be reached and no local copy of baidu/ERNIE-4.5-0.3B-PT", "无法连接模型仓库"),
        ("demo.server", "The server this app uses serves", "本应用所连接的服务器"),
        ("demo.named", "The configuration (model.id) names", "配置（model.id）指定"),
    ],
)
def test_the_demo_notice_says_why_the_demo_answers_in_the_readers_language(code: str, en: str, zh: str) -> None:
    """Each reason the demo model answers, said in the chat's language (the Chinese text used to say the hub was out
    of reach whatever the reason)."""
    why = Phrase(code, model="baidu/ERNIE-4.5-0.3B-PT", demo="SmolLM2-135M-Instruct")
    english = notice_text(Notice("demo", {"note": why}), "en-US")
    chinese = notice_text(Notice("demo", {"note": why}), "zh-CN")
    assert english.startswith(f"ℹ️ Demo mode: {why.text('en')} This tiny stand-in") and en in english
    assert (
        chinese.startswith(f"ℹ️ 演示模式：{why.text('zh')}这是") and zh in chinese and "SmolLM2-135M-Instruct" in chinese
    )
    for other in {"demo.hub", "demo.server", "demo.named"} - {code}:
        assert Phrase(other, model="baidu/ERNIE-4.5-0.3B-PT", demo="SmolLM2-135M-Instruct").text("zh") not in chinese
