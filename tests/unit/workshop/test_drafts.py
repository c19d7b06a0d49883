"""Drafts: checked in the company of the folder's other templates with exactly check-prompts' messages, switched
between form fields and YAML, and routed by the chat's own code (who wins, and why)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from backend.chat.service import ChatService
from backend.config import ROOT
from backend.engines.base import LaunchSpec
from backend.models.resolve import DEMO_NAME
from backend.prompts.schema import Reason
from backend.prompts.store import TemplateStore, check_folder
from backend.workshop.drafts import (
    chat_view,
    draft_folder,
    form_yaml,
    leading_comments,
    preview,
    routing,
    template_files,
    yaml_fields,
)
from tests.conftest import MakeConfig


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """A copy of the shipped templates (default, explain, summary, translation, writing)."""
    return Path(shutil.copytree(ROOT / "prompts", tmp_path / "prompts"))


@pytest.fixture
def service(make_config: MakeConfig, folder: Path) -> ChatService:
    """A chat service on the copied folder; nothing is started (routing needs no engine)."""
    cfg = make_config(paths__prompts_dir=str(folder), engine__name="external", server__base_url="http://127.0.0.1:9/v1")
    return ChatService.from_config(cfg)


KEYWORD_POEM = {"code": "keyword", "value": "poem"}  # a reason as the workshop sends it (Reason.saved)
KEYWORD_WRITE = {"code": "keyword", "value": "写"}
DRAFTS = {
    "unknown field": "name: poem\ntemprature: 3\nuser: '{input}'\n",
    "no input": "name: poem\nuser: Write a poem\n",
    "bad yaml": "name: poem\nuser: a: b\n",
    "a name clash": "name: writing\nuser: '{input}'\n",
    "several": "name: poem\ntemperature: 9\nkeywords: ['']\npatterns: ['(']\nuser: '{topic}'\n",
}


@pytest.mark.parametrize("case", sorted(DRAFTS))
def test_problems_are_exactly_what_check_prompts_prints(
    case: str, folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # "zz-poem" sorts after writing.yaml: check-prompts (a fresh read) gives a name clash to the later file, as the
    # running chat gives it to the newcomer.
    with draft_folder(folder, "zz-poem", DRAFTS[case]) as check:
        shown = [str(p) for p in check.problems]
        assert check.template is None
    assert not (folder / "zz-poem.yaml").exists(), "a check writes nothing to the prompts folder"
    (folder / "zz-poem.yaml").write_text(DRAFTS[case], encoding="utf-8")
    assert check_folder(folder) == 1
    printed = [line for line in capsys.readouterr().out.splitlines() if "zz-poem.yaml" in line.split(":")[0]]
    assert shown and shown == printed


def test_a_good_draft_is_the_template_the_chat_would_load(folder: Path) -> None:
    text = "name: poem\npriority: 5\nkeywords: [poem]\nuser: |\n  A poem about:\n  {input}\n"
    with draft_folder(folder, "poem", text) as check:
        assert check.problems == []
        assert check.template is not None and check.template.name == "poem" and check.template.priority == 5
        assert "poem" in check.store.names() and "writing" in check.store.names()
    shipped = TemplateStore(folder).names()
    with draft_folder(folder, "writing", None) as without:
        assert without.store.names() == [name for name in shipped if name != "writing"], "the others all stay"


def test_editing_an_existing_file_replaces_it_in_the_check(folder: Path) -> None:
    text = (folder / "writing.yaml").read_text(encoding="utf-8").replace("priority: 10", "priority: 11")
    with draft_folder(folder, "writing", text) as check:
        assert check.problems == [], "its own old version is no name clash"
        assert check.template is not None and check.template.priority == 11


def test_form_fields_and_yaml_round_trip() -> None:
    fields = {"name": "poem", "user": "A poem about:\n{input}", "keywords": ["poem", "诗"], "temperature": 1.1,
              "description": "", "patterns": [], "variables": {}, "system": None}  # fmt: skip
    text = form_yaml(fields)
    assert text.splitlines()[:4] == ["name: poem", "keywords:", "- poem", "- 诗"]
    assert "user: |-\n  A poem about:\n  {input}\n" in text  # multi-line text as a block, as people write it
    assert yaml_fields(text) == {"name": "poem", "keywords": ["poem", "诗"], "user": "A poem about:\n{input}",
                                 "temperature": 1.1}  # fmt: skip
    assert yaml_fields("name: [") is None and yaml_fields("- a list") is None
    assert form_yaml({"zzz": 1, "user": "{input}"}) == "user: '{input}'\nzzz: 1\n", "unknown keys last, kept"


def test_template_files(folder: Path) -> None:
    (folder / ".hidden.yaml").write_text("user: '{input}'\n")
    (folder / "notes.txt").write_text("x")
    assert sorted(template_files(folder)) == ["default", "explain", "summary", "translation", "writing"]


def test_routing_says_when_the_draft_wins_and_when_another_template_comes_first(service: ChatService) -> None:
    folder = service.templates.folder
    low = "name: poem\npriority: 5\nkeywords: [poem, 写]\nuser: '{input}'\n"
    with draft_folder(folder, "poem", low) as check:
        plain = routing(service, check.store, check.template, "a poem about the sea")
        assert (plain["picked"], plain["reason"], plain["outcome"]) == ("poem", KEYWORD_POEM, "draft")
        lost = routing(service, check.store, check.template, "写一首诗")
        assert (lost["picked"], lost["reason"], lost["outcome"]) == ("writing", KEYWORD_WRITE, "other_first")
        order = [(c["name"], c["priority"], c["draft"]) for c in lost["candidates"]]
        assert order.index(("writing", 10, False)) < order.index(("poem", 5, True))
        assert next(c for c in lost["candidates"] if c["draft"])["reason"] == KEYWORD_WRITE
        missed = routing(service, check.store, check.template, "hello there")
        assert (missed["picked"], missed["outcome"]) == ("default", "no_match")
        command = routing(service, check.store, check.template, "/poem 写一首诗")
        assert (command["picked"], command["reason"]) == (
            "poem",
            {"code": "command", "value": ""},
        )  # a /name command, as in the chat
    with draft_folder(folder, "poem", low.replace("priority: 5", "priority: 15")) as check:
        won = routing(service, check.store, check.template, "写一首诗")
        assert (won["picked"], won["outcome"]) == ("poem", "draft")


def serve(service: ChatService, demo: bool) -> None:
    """Make the service's engine resolved, serving the demo model or not (as the supervisor's start would)."""
    service.supervisor.spec = LaunchSpec("llama.cpp", [], {}, "127.0.0.1", 1, "m", "k", demo=demo)


@pytest.mark.parametrize("demo", [False, True], ids=["real model", "demo model"])
async def test_the_preview_is_the_request_the_chat_sends_on_the_model_serving(service: ChatService, demo: bool) -> None:
    serve(service, demo)
    folder = service.templates.folder
    text = "name: zebra\npriority: 5\nkeywords: [zebrakey]\nsystem: Always begin with ZEBRA.\nuser: 'Z: {input}'\n"
    service.client = CountingClient()  # type: ignore[assignment]
    with draft_folder(folder, "zebra", text) as check:
        shown = await preview(service, check, "zebrakey about the sea")
        chat = chat_view(service, check.store)
        sent = await chat.build_request([], "zebrakey about the sea", chat.new_session().settings)
    assert (shown["routing"]["outcome"], shown["routing"]["picked"], shown["demo"]) == ("draft", "zebra", demo)
    request = shown["request"]
    assert (request["template"], request["reason"]) == (sent.template, sent.reason.saved())
    assert sent.template == "zebra" and sent.reason == Reason("keyword", "zebrakey")
    assert request["system"] == "Always begin with ZEBRA." and request["user"] == "Z: zebrakey about the sea"
    assert request["messages"] == sent.messages and request["sampling"] == sent.sampling
    assert ("frequency_penalty" in request["sampling"]) == demo, "the demo's penalties where the template sets none"


async def test_the_preview_says_when_a_draft_is_off_on_the_demo(service: ChatService) -> None:
    serve(service, True)
    service.client = CountingClient()  # type: ignore[assignment]
    text = "name: zebra\nkeywords: [zebrakey]\nroute_on_demo: false\nuser: 'Z: {input}'\n"
    with draft_folder(service.templates.folder, "zebra", text) as check:
        shown = await preview(service, check, "zebrakey please")
    assert (shown["routing"]["outcome"], shown["routing"]["picked"]) == ("demo_off", "default")
    assert (
        shown["request"]["reason"] == {"code": "demo_off", "value": "zebra"}
        and shown["request"]["user"] == "zebrakey please"
    )
    assert next(c for c in shown["routing"]["candidates"] if c["draft"])["route_on_demo"] is False


def test_an_external_server_serving_the_demo_model_is_the_demo(make_config: MakeConfig, folder: Path) -> None:
    cfg = make_config(paths__prompts_dir=str(folder), engine__name="external", server__base_url="http://127.0.0.1:9/v1",
                      model__id=f"HuggingFaceTB/{DEMO_NAME}")  # fmt: skip
    service = ChatService.from_config(cfg)
    assert not service.serving_demo, "not known before the engine is resolved"
    service.supervisor.spec = LaunchSpec("external", [], {}, "", 0, "m", "k")
    assert service.serving_demo and service.serving().model == DEMO_NAME


class CountingClient:
    """Counts tokens by words; nothing is streamed here."""

    async def count_tokens(self, messages: list[dict[str, Any]]) -> int:
        return sum(len(str(m["content"]).split()) for m in messages) + 4

    def forget_templates(self) -> None:
        return None

    async def max_model_len(self) -> int:
        return 4096


def test_the_form_keeps_the_comment_lines_a_file_starts_with(folder: Path) -> None:
    text = (folder / "writing.yaml").read_text(encoding="utf-8")
    header = leading_comments(text)
    assert header.startswith("# ") and header.count("\n") == 6 and "name:" not in header
    fields = yaml_fields(text)
    assert fields is not None
    rewritten = form_yaml(fields, header)
    assert rewritten.startswith(header + "name: writing\n")
    assert yaml_fields(rewritten) == fields
    assert leading_comments("\n# one\n\n# two\nname: x\n# later\n") == "# one\n\n# two\n"
    assert leading_comments(None) == "" and leading_comments("name: x\n") == ""
