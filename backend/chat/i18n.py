"""The chat's own messages in English and Simplified Chinese; the browser's language picks one.

Errors are rendered by `describe` (one text) or `describe_parts` (message and hint apart): the texts of catalogued
errors live in backend.errors.CATALOG, in both languages; an error without a catalog code is shown in English."""

from __future__ import annotations

from typing import Any

from backend.errors import ServiceError, lang_of

__all__ = ["MESSAGES", "describe", "describe_parts", "lang_of", "t"]

MESSAGES: dict[str, dict[str, str]] = {
    "starting": {
        "en": "⏳ The model server is starting ({elapsed:.0f} s so far). "
        "Your message will be answered when it is ready.",
        "zh": "⏳ 模型服务正在启动（已用 {elapsed:.0f} 秒），就绪后会自动回复您的消息。",
    },
    "restarting": {
        "en": "⏳ The model server is restarting after a problem ({elapsed:.0f} s so far): {error}",
        "zh": "⏳ 模型服务出现问题，正在重启（已用 {elapsed:.0f} 秒）：{error}",
    },
    "ready": {
        "en": "✅ The model server is ready ({elapsed:.0f} s).",
        "zh": "✅ 模型服务已就绪（用时 {elapsed:.0f} 秒）。",
    },
    "not_ready": {
        "en": "⌛ The model server is still not ready after {elapsed:.0f} s. Please try again in a moment.",
        "zh": "⌛ 等待 {elapsed:.0f} 秒后模型服务仍未就绪，请稍后再试。",
    },
    "failed": {
        "en": "❌ The model server could not start: {error}\n\n{hint}\n\nSend another message to try again.",
        "zh": "❌ 模型服务无法启动：{error}\n\n{hint}\n\n修复原因后再发送一条消息即可重试。",
    },
    "log_tail": {
        "en": "Last lines of the engine log ({path}):",
        "zh": "引擎日志的最后几行（{path}）：",
    },
    "demo": {
        "en": "ℹ️ Demo mode: {note} This tiny stand-in (135 million parameters, English only) handles greetings, "
        "short English questions and simple explanations, but it often gets facts wrong, its longer texts ramble "
        "and get cut off, and it cannot write Chinese. Use it to try the chat; for reliable answers, and for "
        "Chinese, install the ERNIE model (see README).",
        "zh": "ℹ️ 演示模式：无法连接模型仓库，且本机没有 ERNIE-4.5-0.3B-PT 的副本，现在回答你的是一个很小的离线替代模型"
        "（SmolLM2-135M-Instruct，1.35 亿参数，只懂英文）。"
        "它能比较好地回应问候、简短的英文问题和简单的解释，但常常答错事实，"
        "较长的文字会跑题并被截断，而且它不会写中文：中文消息往往得到错乱或重复的文字。它只适合用来试用界面；要得到可靠的回答"
        "或使用中文，请安装 ERNIE 模型（见 README）。",
    },
    "stopped": {"en": "⏹ *Stopped.*", "zh": "⏹ *已停止。*"},
    "restarted": {
        "en": "⚠️ *Cut off by a restart of the app: this is what was written before it.*",
        "zh": "⚠️ *应用重启，回复被中断：以上是中断前已生成的内容。*",
    },
    "interrupted": {
        "en": "⚠️ *The reply was interrupted:* {error}",
        "zh": "⚠️ *回复中断：* {error}",
    },
    "error": {"en": "⚠️ {error}", "zh": "⚠️ 出错了：{error}"},
    "trimmed": {
        "en": "*The oldest {dropped} messages no longer fit in the model's context window and were left out.*",
        "zh": "*最早的 {dropped} 条消息已超出模型的上下文窗口，本次未发送给模型。*",
    },
    "reason_keyword": {"en": 'keyword "{value}"', "zh": "关键词“{value}”"},
    "reason_pattern": {"en": 'pattern "{value}"', "zh": "匹配规则“{value}”"},
    "reason_default": {"en": "no rule matched (default)", "zh": "未匹配任何规则（默认模板）"},
    "reason_chosen": {"en": "chosen in ⚙️ settings", "zh": "在 ⚙️ 设置中选择"},
    "reason_command": {"en": "chosen with /name", "zh": "用 /名称 选择"},
    "reason_demo_off": {
        "en": "{value} matches, but does not route on the demo model (default)",
        "zh": "匹配 {value}，但它在演示模型上不自动选用（默认模板）",
    },
    # the reason of replies saved before templates routed on the demo model; shown when such a chat is resumed
    "reason_demo": {"en": "demo model: automatic templates are off", "zh": "演示模型：不自动选择模板"},
    "detail_ttft": {"en": "first token {seconds:.2f} s", "zh": "首个 token {seconds:.2f} 秒"},
    "detail_speed": {"en": "{speed:.1f} tokens/s", "zh": "{speed:.1f} token/秒"},
    "detail_tokens": {"en": "{prompt} prompt + {output} reply tokens", "zh": "输入 {prompt} + 输出 {output} token"},
    "detail_prompt_tokens": {"en": "{prompt} prompt tokens", "zh": "输入 {prompt} token"},
    "details_title": {"en": "Reply details", "zh": "回复详情"},
    "template_problems": {
        "en": "⚠️ Some prompt templates have problems (a file that worked before keeps its last good version in use "
        "until it is fixed; a new one is not used yet):",
        "zh": "⚠️ 部分提示模板有错误（之前正常的文件在修好之前继续使用上一个正确的版本；新文件暂不使用）：",
    },
    "storage_failed": {
        "en": "⚠️ Conversation history is unavailable: {error} The chat still works, but is not being saved.",
        "zh": "⚠️ 对话历史暂不可用：{error} 仍可正常聊天，但本次对话不会被保存。",
    },
    "tagline": {
        "en": "A self-hosted chat: the model runs on this machine, nothing leaves it.",
        "zh": "自托管聊天：模型在本机运行，数据不会离开这台机器。",
    },
    "serving_demo": {"en": "{model} (offline demo, not ERNIE)", "zh": "{model}（离线演示模型，不是 ERNIE）"},
    "engine_choosing": {"en": "engine being chosen", "zh": "正在选择引擎"},
    "state_starting": {"en": "starting… {elapsed:.0f} s", "zh": "正在启动… {elapsed:.0f} 秒"},
    "state_restarting": {"en": "restarting… {elapsed:.0f} s", "zh": "正在重启… {elapsed:.0f} 秒"},
    "state_ready": {"en": "ready", "zh": "已就绪"},
    "state_failed": {
        "en": "could not start: send a message to see why and retry",
        "zh": "无法启动：发送一条消息即可查看原因并重试",
    },
    "state_stopped": {"en": "stopped", "zh": "已停止"},
    "starter_write": {"en": "Write a poem", "zh": "写一首诗"},
    "starter_write_message": {"en": "Write a short poem about the sea.", "zh": "写一首关于大海的短诗。"},
    "starter_summary": {"en": "Summarise a text", "zh": "总结一段文字"},
    "starter_summary_message": {
        "en": "Summarise: The meeting moved to Friday because two speakers were ill. Lunch will be served at "
        "noon, and the slides will be shared with everyone afterwards.",
        "zh": "总结：因为两位发言人生病，会议改到周五举行。中午提供午餐，会后会把幻灯片发给所有人。",
    },
    "starter_translation": {"en": "Translate into Chinese", "zh": "翻译成英文"},
    "starter_translation_message": {
        "en": "Translate into Chinese: The weather is lovely today, let's go for a walk.",
        "zh": "翻译成英文：今天天气很好，我们去散步吧。",
    },
    "starter_explain": {"en": "Explain code", "zh": "解释代码"},
    "starter_explain_message": {
        "en": "Explain this code: sorted(words, key=len, reverse=True)[:3]",
        "zh": "解释代码：sorted(words, key=len, reverse=True)[:3]",
    },
    "action_regenerate": {"en": "Regenerate", "zh": "重新生成"},
    "action_export_md": {"en": "Export Markdown", "zh": "导出 Markdown"},
    "action_export_json": {"en": "Export JSON", "zh": "导出 JSON"},
    "export_title": {"en": "Conversation", "zh": "对话记录"},
    "role_user": {"en": "User", "zh": "用户"},
    "role_assistant": {"en": "Assistant", "zh": "助手"},
    "exported": {
        "en": "📄 The conversation so far, as the model has it ({messages} messages):",
        "zh": "📄 目前为止的对话，与模型所见一致（{messages} 条消息）：",
    },
    "nothing_to_export": {"en": "Nothing to export yet: no reply so far.", "zh": "还没有可导出的内容：目前没有回复。"},
    "nothing_to_regenerate": {"en": "There is no reply to regenerate.", "zh": "没有可以重新生成的回复。"},
    "setting_temperature": {"en": "Temperature", "zh": "温度（temperature）"},
    "setting_top_p": {"en": "Top P", "zh": "Top P（核采样）"},
    "setting_max_tokens": {"en": "Max tokens", "zh": "最大生成长度（max tokens）"},
    "setting_template": {"en": "Prompt template", "zh": "提示模板"},
    "template_auto": {"en": "auto (by message)", "zh": "自动（按消息内容）"},
    "template_help_auto": {
        "en": "auto: each message picks its template from its words (write, summarise, translate, explain code); "
        "the line under each reply says which. Type / to pick one for a single message.",
        "zh": "自动：每条消息按内容选择模板（写作、总结、翻译、解释代码），回复下方会注明所用模板。"
        "输入 / 可为单条消息选择模板。",
    },
    "template_help_auto_demo": {
        "en": "auto: each message picks its template from its words, also on the demo model, except templates "
        "that are off for it (route_on_demo: false); the line under each reply says which. Type / to pick one "
        "for a single message.",
        "zh": "自动：每条消息按内容选择模板，演示模型也一样，只是不会自动选用对它关闭的模板（route_on_demo: false）；"
        "回复下方会注明所用模板。输入 / 可为单条消息选择模板。",
    },
    "template_help_chosen": {
        "en": "Every message uses {name}: {description}. Pick auto to let each message choose.",
        "zh": "每条消息都使用 {name}：{description}。选择“自动”可让每条消息自行匹配。",
    },
    "workshop_serving": {
        "en": "Answering in the chat now: {serving} ({state}).",
        "zh": "聊天现在由 {serving} 回答（{state}）。",
    },
    "workshop_routing": {
        "en": "Templates route by their keywords and patterns; a saved template is used from the chat's next message. "
        "The preview and the try show exactly what the chat sends to this model.",
        "zh": "模板按关键词和匹配规则自动选用；保存后的模板从聊天的下一条消息起生效。"
        "预览和试用显示的正是聊天发给这个模型的内容。",
    },
    "workshop_routing_demo": {
        "en": "This is the offline demo model, not ERNIE. Templates route on it too, by their keywords and patterns, "
        "each with its own system text, except those whose route_on_demo is false (they are still used when "
        "chosen with /name or in the settings); a saved template is used from the chat's next message. The preview "
        "and the try show exactly what the chat sends to this model.",
        "zh": "这是离线演示模型，不是 ERNIE。模板在它上面同样按关键词和匹配规则自动选用，并使用各自的系统提示；"
        "route_on_demo 为 false 的模板除外（用 /名字 或在设置中选择时仍会使用）。保存后的模板从聊天的下一条消息起生效。"
        "预览和试用显示的正是聊天发给这个模型的内容。",
    },
    "settings_saved": {"en": "✓ Settings saved: {changes}", "zh": "✓ 设置已保存：{changes}"},
    "settings_unchanged": {"en": "Settings unchanged", "zh": "设置未改变"},
    "list_separator": {"en": ", ", "zh": "，"},
}


def t(key: str, locale: str | None, **params: Any) -> str:
    """The message `key` in the language of `locale`, formatted with `params`."""
    entry = MESSAGES[key]
    return entry.get(lang_of(locale), entry["en"]).format(**params)


def describe(error: BaseException | str | None, locale: str | None) -> str:
    """An error as the user reads it, message and hint, in the language of `locale` when the catalog has it.

    For t("error", ..., error=describe(exc, locale)) and the other messages that show an error."""
    if error is None:
        return ""
    if isinstance(error, ServiceError):
        return error.text(locale)
    return str(error)


def describe_parts(error: BaseException | str | None, locale: str | None) -> tuple[str, str]:
    """(message, hint) of an error in the language of `locale`, for messages that show them apart (t("failed"))."""
    if isinstance(error, ServiceError):
        return error.localized(locale)
    return ("" if error is None else str(error)), ""
