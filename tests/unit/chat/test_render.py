"""What the user reads of a finished reply: its text and ending, and its details apart, in English and Chinese."""

from __future__ import annotations

from backend.chat.client import StreamStats
from backend.chat.i18n import t
from backend.chat.render import (
    DETAILS_KEY,
    details_element,
    localized,
    reason_text,
    reply_details,
    reply_text,
    settings_saved,
    template_commands,
    template_select,
)
from backend.chat.turn import Done
from backend.errors import InvalidInputError
from backend.prompts.schema import Reason

SUMMARY = Reason("keyword", "总结")
DEFAULT, CHOSEN = Reason("default"), Reason("chosen")
CODES = [Reason.KEYWORD, Reason.PATTERN, Reason.DEFAULT, Reason.CHOSEN, Reason.COMMAND, Reason.DEMO_OFF]


def stats(prompt: int | None = 12, output: int | None = 30) -> StreamStats:
    # started at 10 s, first text at 10.25 s, last at 12.25 s: 30 tokens in 2 s of decoding
    return StreamStats(started=10.0, first_token=10.25, finished=12.25, prompt_tokens=prompt, completion_tokens=output)


def test_a_finished_reply_is_the_model_text_alone() -> None:
    assert reply_text(Done("Paris.", "default", DEFAULT, "q"), "zh-CN") == "Paris."


def test_a_stopped_reply_ends_with_one_stop_line_in_the_language() -> None:
    assert reply_text(Done("Par", "default", CHOSEN, "q", "stopped"), "zh-CN") == "Par\n\n⏹ *已停止。*"
    assert reply_text(Done("", "default", CHOSEN, "q", "stopped"), "en-US") == "⏹ *Stopped.*"


def test_a_failed_reply_without_text_is_the_error() -> None:
    error = InvalidInputError.of("input.empty")
    assert reply_text(Done("", "default", CHOSEN, "q", "failed", error), "en-US") == f"⚠️ {error.text('en')}"


def test_reasons_read_in_chinese() -> None:
    assert reason_text(SUMMARY, "zh-CN") == "关键词“总结”"
    assert reason_text(SUMMARY, "en-US") == 'keyword "总结"'
    assert reason_text(Reason("pattern", "^def "), "zh-CN") == "匹配规则“^def ”"
    assert reason_text(DEFAULT, "zh-CN") == "未匹配任何规则（默认模板）"
    assert reason_text(Reason("demo_off", "writing"), "en") == (
        "writing matches, but does not route on the demo model (default)"
    )
    assert reason_text(SUMMARY.saved(), "zh-CN") == "关键词“总结”", "as saved in a reply's metadata"


def test_reasons_saved_as_english_text_in_older_threads_still_read() -> None:
    assert reason_text('keyword "总结"', "zh-CN") == "关键词“总结”"
    assert reason_text('pattern "^def "', "zh-CN") == "匹配规则“^def ”"
    assert reason_text("no rule matched", "zh-CN") == "未匹配任何规则（默认模板）"
    assert reason_text("chosen", "zh-CN") == "在 ⚙️ 设置中选择" and reason_text("command", "zh-CN") == "用 /名称 选择"
    assert reason_text("demo model: automatic templates are off", "zh-CN") == "演示模型：不自动选择模板"
    assert reason_text('demo_off "writing"', "en") == "writing matches, but does not route on the demo model (default)"
    assert reason_text("something new", "zh-CN") == "something new"
    assert [Reason.read(Reason(code, "v").saved()) for code in CODES] == [Reason(code, "v") for code in CODES]


def test_a_bilingual_description_gives_the_half_in_the_language() -> None:
    both = "总结：三句话 / Summary: three sentences"
    assert localized(both, "zh-CN") == "总结：三句话" and localized(both, "en-US") == "Summary: three sentences"
    assert localized("Summary: three sentences", "zh-CN") == "Summary: three sentences"
    assert localized("a / b / c", "en-US") == "a / b / c"


def test_details_from_the_stream_numbers() -> None:
    details = reply_details(Done("x", "summary", SUMMARY, "q", stats=stats(), prompt_tokens=99))
    assert details == {
        "template": "summary",
        "reason": {"code": "keyword", "value": "总结"},  # data, worded when shown
        "ttft_s": 0.25,
        "tokens_per_s": 15.0,
        "prompt_tokens": 12,  # the engine's count wins over the request's estimate
        "completion_tokens": 30,
    }


def test_details_line_in_chinese_and_the_metadata() -> None:
    done = Done("x", "summary", SUMMARY, "q", stats=stats(), prompt_tokens=99)
    props, metadata = details_element(done, "zh-CN", "总结：三句话 / Summary: three sentences")
    assert props["items"] == [
        "summary",
        "关键词“总结”",
        "首个 token 0.25 秒",
        "15.0 token/秒",
        "输入 12 + 输出 30 token",
    ]
    assert props["title"] == "总结：三句话" and props["label"] == "回复详情"
    assert metadata == {DETAILS_KEY: reply_details(done)}


def test_details_leave_out_what_the_stream_did_not_measure() -> None:
    # stopped before any text and before the engine reported usage: the request's own prompt count
    done = Done("", "default", CHOSEN, "q", "stopped", stats=StreamStats(started=1.0), prompt_tokens=7)
    props, _ = details_element(done, "en-US", "")
    assert props["items"] == ["default", "chosen in ⚙️ settings", "7 prompt tokens"]


DESCRIBED = [("summary", "总结：三句话 / Summary: three sentences"), ("default", "")]


def test_the_selector_lists_descriptions_and_explains_the_choice() -> None:
    items, value, help_line = template_select(DESCRIBED, None, False, "zh-CN")
    assert items == {"自动（按消息内容）": "auto", "summary · 总结：三句话": "summary", "default": "default"}
    assert value == "auto" and help_line == t("template_help_auto", "zh-CN")
    _, value, help_line = template_select(DESCRIBED, "summary", False, "en-US")
    assert value == "summary" and help_line == "Every message uses summary: Summary: three sentences. Pick auto to " \
        "let each message choose."  # fmt: skip
    assert template_select(DESCRIBED, None, True, "en-US")[2] == t("template_help_auto_demo", "en-US")
    assert template_select(DESCRIBED, "gone", False, "en-US")[1] == "auto", "a template that went away"


def test_the_slash_menu_has_one_command_a_template() -> None:
    commands = template_commands(DESCRIBED, "zh-CN")
    assert [(c["id"], c["description"]) for c in commands] == [("summary", "总结：三句话"), ("default", "default")]
    assert not any(c["persistent"] or c["button"] for c in commands), "a pick is for one message"


def test_a_settings_change_is_acknowledged_with_what_changed() -> None:
    assert (
        settings_saved({"template": "summary", "temperature": 0.3}, "zh-CN")
        == "✓ 设置已保存：提示模板 → summary，温度（temperature） → 0.3"
    )
    assert settings_saved({"template": None}, "en-US") == "✓ Settings saved: Prompt template → auto (by message)"
    assert settings_saved({}, "en-US") == "Settings unchanged"


def test_a_place_in_line_shows_a_measured_wait_none_before_and_says_when_it_runs_late() -> None:
    from backend.chat.render import wait_text
    from backend.chat.turn import Queued

    assert wait_text(Queued(3, 42.4), "en-US") == t("queued", "en-US", place=3, wait=42.4)
    assert "42 s" in wait_text(Queued(3, 42.4), "en-US") and "42 秒" in wait_text(Queued(3, 42.4), "zh-CN")
    unmeasured = wait_text(Queued(3, None), "zh-CN")
    assert unmeasured == t("queued_measuring", "zh-CN", place=3) and "秒" not in unmeasured
    late = wait_text(Queued(2, 20.0, late=True), "en-US")
    assert late == t("queued_late", "en-US", place=2, wait=20.0) and "longer than the server expected" in late
    assert wait_text(Queued(0, 61.0), "en-US") == t("queue_done", "en-US", waited=61.0)
