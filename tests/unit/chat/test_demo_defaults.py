"""While the offline demo model answers, templates route as with ERNIE (except those whose route_on_demo is false),
each with its own system prompt; what a template leaves unset comes from the demo's measured defaults
(results/demo-quality/): its sampling, penalties and system prompt."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from backend.chat.request import UserSettings
from backend.chat.service import ChatService
from backend.chat.turn import Serving
from backend.config import ROOT, EngineFlags, load_config
from backend.engines.base import LaunchSpec
from backend.models.resolve import DEMO_NAME
from backend.prompts.schema import Reason
from backend.prompts.store import TemplateStore
from backend.serving.hardware import Gpu, parse_nvidia_smi
from backend.serving.supervisor import State, Status


class CountingClient:
    """Counts tokens by words (enough for the context budget); nothing is streamed here."""

    async def count_tokens(self, messages: list[dict[str, Any]]) -> int:
        return sum(len(str(m["content"]).split()) for m in messages) + 4

    def forget_templates(self) -> None:
        return None

    async def max_model_len(self) -> int:
        return 4096


class ServingSupervisor:
    def __init__(self, demo: bool) -> None:
        self.spec = LaunchSpec("llama.cpp", [], {}, "127.0.0.1", 1, "m", "k", demo=demo)
        self.flags = EngineFlags(max_model_len=4096)
        self.status = Status(State.READY)
        self.gpus: list[Gpu] = []


def service(demo: bool) -> ChatService:
    cfg = load_config(environ={})
    templates = TemplateStore(Path(ROOT / "prompts"))
    return ChatService(cfg, ServingSupervisor(demo), CountingClient(), templates)  # type: ignore[arg-type]


async def test_a_message_no_template_catches_gets_the_demo_sampling_and_system_prompt() -> None:
    svc = service(demo=True)
    assert svc.serving_demo
    settings = UserSettings.defaults(svc.cfg, demo=True)
    assert (settings.temperature, settings.max_tokens) == (svc.cfg.demo.temperature, svc.cfg.demo.max_tokens)
    request = await svc.build_request([], "What is the capital of France?", settings)
    demo = svc.cfg.demo
    assert request.sampling == {
        "temperature": demo.temperature,
        "top_p": demo.top_p,
        "max_tokens": demo.max_tokens,
        "frequency_penalty": demo.frequency_penalty,
        "presence_penalty": demo.presence_penalty,
    }
    assert request.messages[0] == {"role": "system", "content": demo.system_prompt}
    assert request.messages[-1] == {"role": "user", "content": "What is the capital of France?"}
    assert (request.template, request.reason) == ("default", Reason("default"))


async def test_the_shipped_templates_state_that_they_do_not_route_on_the_demo() -> None:
    # measured: the ERNIE-written Chinese templates make the demo model write garbage (results/demo-quality/)
    svc = service(demo=True)
    request = await svc.build_request([], "Write a short poem about the sea.", UserSettings.defaults(svc.cfg, True))
    assert (request.template, request.reason) == ("default", Reason("demo_off", "writing"))
    assert request.messages[0] == {"role": "system", "content": svc.cfg.demo.system_prompt}
    assert [n for n in svc.templates.names() if not svc.templates.get(n).route_on_demo] == [
        "translation", "summary", "writing"
    ]  # fmt: skip
    assert svc.templates.get("explain").route_on_demo, "measured: the demo explains code well with it"


def write(folder: Path, name: str, text: str) -> None:
    (folder / f"{name}.yaml").write_text(text, encoding="utf-8")


def demo_service(tmp_path: Path) -> ChatService:
    """The demo model serving a copy of the shipped templates plus a new one (zebra, as an editor would write it)."""
    folder = Path(shutil.copytree(ROOT / "prompts", tmp_path / "prompts"))
    write(folder, "zebra", "name: zebra\nkeywords: [zebrakey]\nsystem: Always begin with ZEBRA.\nuser: '{input}'\n")
    svc = service(demo=True)
    svc.templates = TemplateStore(folder)
    return svc


async def test_a_saved_template_routes_on_the_demo_with_its_own_system_prompt(tmp_path: Path) -> None:
    svc = demo_service(tmp_path)
    request = await svc.build_request([], "zebrakey: tell me a joke", UserSettings.defaults(svc.cfg, demo=True))
    assert (request.template, request.reason) == ("zebra", Reason("keyword", "zebrakey"))
    assert request.messages[0] == {"role": "system", "content": "Always begin with ZEBRA."}
    demo = svc.cfg.demo  # what the template leaves unset: the demo's measured defaults, penalties included
    assert request.sampling["temperature"] == demo.temperature
    assert request.sampling["frequency_penalty"] == demo.frequency_penalty
    decision = svc.decide("zebrakey: tell me a joke", UserSettings.defaults(svc.cfg, demo=True))
    assert (decision.template, decision.system, decision.sampling) == ("zebra", request.messages[0]["content"],
                                                                        request.sampling)  # fmt: skip


async def test_a_template_that_is_off_on_the_demo_is_skipped_by_routing_but_named(tmp_path: Path) -> None:
    svc = demo_service(tmp_path)
    write(svc.templates.folder, "zebra", "name: zebra\nkeywords: [zebrakey]\nroute_on_demo: false\nuser: 'Z {input}'\n")
    settings = UserSettings.defaults(svc.cfg, demo=True)
    skipped = await svc.build_request([], "zebrakey please", settings)
    assert (skipped.template, skipped.reason) == ("default", Reason("demo_off", "zebra"))
    assert skipped.messages[0] == {"role": "system", "content": svc.cfg.demo.system_prompt}
    named = await svc.build_request([], "/zebra please", settings)
    assert (named.template, named.user_text) == ("zebra", "Z please"), "/name chooses it all the same"
    svc.supervisor.spec = LaunchSpec("vllm", [], {}, "127.0.0.1", 1, "m", "k")  # the real model: routing as always
    assert (await svc.build_request([], "zebrakey please", UserSettings.defaults(svc.cfg))).template == "zebra"


async def test_a_template_asked_for_by_name_sends_its_own_system_prompt_and_sampling_on_the_demo() -> None:
    svc = service(demo=True)
    request = await svc.build_request([], "/writing a poem", UserSettings.defaults(svc.cfg, demo=True))
    writing = svc.templates.get("writing")
    assert request.template == "writing" and "【任务】" in request.user_text
    assert request.messages[0] == {"role": "system", "content": writing.system}
    assert request.sampling["temperature"] == writing.sampling["temperature"]
    assert request.sampling["presence_penalty"] == svc.cfg.demo.presence_penalty, "the template sets none"


async def test_the_users_own_choice_wins_over_the_demo_defaults() -> None:
    svc = service(demo=True)
    settings = UserSettings.defaults(svc.cfg, demo=True)
    settings.update({"temperature": 1.1}, svc.cfg, demo=True)
    request = await svc.build_request([], "Hello!", settings)
    assert request.sampling["temperature"] == pytest.approx(1.1)


async def test_the_real_model_keeps_the_chat_defaults_and_the_templates_sampling() -> None:
    svc = service(demo=False)
    request = await svc.build_request([], "Write a short poem about the sea.", UserSettings.defaults(svc.cfg))
    assert request.template == "writing" and request.sampling["temperature"] == 0.8
    assert "frequency_penalty" not in request.sampling
    plain = await svc.build_request([], "Hello!", UserSettings.defaults(svc.cfg))
    assert plain.sampling["temperature"] == svc.cfg.chat.temperature
    assert plain.messages[0]["role"] == "user", "no system prompt is configured for the real model"


def test_the_first_page_names_the_demo_model_its_engine_and_device() -> None:
    serving = service(demo=True).serving()
    assert serving == Serving(DEMO_NAME, "llama.cpp", "CPU", "ready", serving.elapsed_s, demo=True)
    assert service(demo=False).serving().model == "ERNIE-4.5-0.3B-PT"  # the configured model, by its folder name


def test_the_first_page_names_the_gpu_the_engine_runs_on() -> None:
    svc = service(demo=False)
    svc.supervisor.spec = LaunchSpec("vllm", [], {}, "127.0.0.1", 1, "m", "k")
    svc.supervisor.gpus = parse_nvidia_smi("NVIDIA H200, 143771, 9.0")
    assert (svc.serving().engine, svc.serving().device) == ("vllm", "H200")
    svc.supervisor.gpus = parse_nvidia_smi("NVIDIA H200, 143771, 9.0\nNVIDIA H200, 143771, 9.0")
    assert svc.serving().device == "2 x H200"
    svc.supervisor.gpus = []  # nvidia-smi said nothing: still a GPU engine
    assert svc.serving().device == "GPU"


def test_a_settings_change_reports_what_changed() -> None:
    svc = service(demo=False)
    session = svc.new_session()
    assert svc.update_settings(session, {"template": "summary", "temperature": session.settings.temperature}) == {
        "template": "summary"
    }
    assert svc.update_settings(session, {"template": "auto", "max_tokens": 64}) == {"template": None, "max_tokens": 64}
    assert svc.update_settings(session, {"template": "auto"}) == {}
