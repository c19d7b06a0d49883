"""Prompt templates: routing, rendering, broken files, hot reload and the check command, on real files."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from backend.cli import main as cli_main
from backend.prompts.schema import AUTO, MAX_FILE_BYTES, Reason, TemplateFile, TemplateProblem, form_fields
from backend.prompts.store import TemplateStore, UnknownTemplate

REPO = Path(__file__).resolve().parents[3]
SHIPPED = REPO / "prompts"


def write(folder: Path, name: str, text: str | bytes) -> Path:
    """Write a template file and move its mtime forward, so a reload never depends on timer resolution."""
    path = folder / name
    old = path.stat().st_mtime_ns if path.exists() else 0
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    stamp = max(old + 1_000_000_000, path.stat().st_mtime_ns)
    os.utime(path, ns=(stamp, stamp))
    return path


def template(name: str, user: str = "{input}", **fields: str) -> str:
    extra = "".join(f"{key}: {value}\n" for key, value in fields.items())
    return f'name: {name}\nuser: "{user}"\n{extra}'


@pytest.fixture(scope="module")
def shipped() -> TemplateStore:
    return TemplateStore(SHIPPED)


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    write(tmp_path, "default.yaml", template("default"))
    return tmp_path


# ---- the shipped templates -------------------------------------------------------------------------


def test_shipped_templates_load_without_problems(shipped: TemplateStore) -> None:
    assert shipped.problems() == []
    assert set(shipped.names()) >= {"default", "writing", "summary", "translation", "explain"}
    assert shipped.names()[-1] == "default"
    assert all(description for _, description in shipped.describe())


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        ("总结", "summary"),
        ("请总结一下这篇文章：今天我们开会讨论了预算。", "summary"),
        ("用三句话概括下面的新闻", "summary"),
        ("写一首诗", "writing"),
        ("帮我生成一个关于秋天的故事", "writing"),
        ("翻译成英文：今天我写了一首诗，想总结一下。", "translation"),
        ("把这段话译成中文", "translation"),
        ("解释一下这段代码：def f(x): return x * 2", "explain"),
        ("```python\nprint('hi')\n```\n这段代码是什么意思？", "explain"),
        ("你好", "default"),
        ("今天天气怎么样？", "default"),
        ("Write a poem about autumn", "writing"),
        ("Compose an email to my landlord", "writing"),
        ("Please summarize this article", "summary"),
        ("Summarise the meeting notes", "summary"),
        ("tl;dr: the quarterly report says revenue went up", "summary"),
        ("Translate to Chinese: good morning", "translation"),
        ("Can you explain this code?\nfor i in range(3): print(i)", "explain"),
        ("What does this function do?", "explain"),
        ("hello", "default"),
        ("I am a writer from Beijing", "default"),
        ("explain recursion", "default"),
    ],
)
def test_shipped_routing(shipped: TemplateStore, message: str, expected: str) -> None:
    assert shipped.route(message).template == expected


def test_writing_prompt_is_structured_plain_prose(shipped: TemplateStore) -> None:
    prompt = shipped.route("写一首关于春天的诗")
    assert prompt.user.index("【任务】") < prompt.user.index("【要求】") < prompt.user.index("【输出】")
    assert "写一首关于春天的诗" in prompt.user
    assert "Markdown" in prompt.user and "段落" in prompt.user
    assert prompt.system and "{" not in prompt.user
    assert set(prompt.sampling) <= {"temperature", "top_p", "max_tokens", "stop"}
    assert prompt.reason == Reason("keyword", "写")


def test_summary_prompt_limits_sentences(shipped: TemplateStore) -> None:
    prompt = shipped.route("总结：会议决定下周发布新版本。")
    assert "最多3句话" in prompt.user and "不超过25个字" in prompt.user and "不要编号" in prompt.user
    assert prompt.user.endswith("总结：会议决定下周发布新版本。")
    assert prompt.sampling["max_tokens"] <= 300


def test_default_passes_message_through_unchanged(shipped: TemplateStore) -> None:
    message = "  你好 {name} }{ {{x}}\n第二行  "
    prompt = shipped.route(message)
    assert (prompt.template, prompt.system, prompt.user, prompt.sampling) == ("default", None, message, {})


def test_braces_in_the_message_never_break_rendering(shipped: TemplateStore) -> None:
    message = "总结：a {input} b {0} c {{ d }} e { f } g {x.y} h }"
    prompt = shipped.route(message)
    assert prompt.template == "summary"
    assert message in prompt.user


def test_rendering_fills_variables_and_literal_braces(folder: Path) -> None:
    write(folder, "json.yaml", 'name: json\nuser: "{{\\"text\\": \\"{input}\\", \\"tone\\": \\"{tone}\\"}}"\n'
          "variables:\n  tone: calm\nsystem: Reply in {tone} JSON.\n")  # fmt: skip
    prompt = TemplateStore(folder).route("hi {there}", explicit="json")
    assert prompt.user == '{"text": "hi {there}", "tone": "calm"}'
    assert prompt.system == "Reply in calm JSON."


@pytest.mark.parametrize("language", [0, 1], ids=["zh", "en"])
def test_readme_example_is_a_valid_template(tmp_path: Path, language: int) -> None:
    readme = (SHIPPED / "README.md").read_text(encoding="utf-8")
    examples = [block for block in re.findall(r"```yaml\n(.*?)```", readme, re.DOTALL) if "name: poem" in block]
    assert len(examples) == 2
    write(tmp_path, "poem.yaml", examples[language])
    store = TemplateStore(tmp_path)
    assert [str(problem) for problem in store.problems() if "poem" in problem.path] == []
    prompt = store.route("帮我写一首关于月亮的诗")
    assert prompt.template == "poem" and "七言绝句" in prompt.user
    assert prompt.sampling == {"temperature": 0.9, "top_p": 0.9, "max_tokens": 200, "stop": ["【任务】"]}


# ---- routing rules ----------------------------------------------------------------------------------


def test_higher_priority_wins_and_ties_go_by_name(folder: Path) -> None:
    write(folder, "low.yaml", template("low", keywords="[hello]", priority="1"))
    write(folder, "zeta.yaml", template("zeta", keywords="[hello]", priority="5"))
    write(folder, "alpha.yaml", template("alpha", keywords="[hello]", priority="5"))
    store = TemplateStore(folder)
    assert store.names() == ["alpha", "zeta", "low", "default"]
    assert store.route("hello there").template == "alpha"


def test_patterns_are_regular_expressions_ignoring_case(folder: Path) -> None:
    write(folder, "sql.yaml", template("sql", patterns=r"['^select\b']"))
    store = TemplateStore(folder)
    prompt = store.route("SELECT * FROM users")
    assert prompt.template == "sql" and prompt.reason.code == "pattern"
    assert store.route("please select one").template == "default"


def test_rules_read_the_instruction_not_the_pasted_text(shipped: TemplateStore) -> None:
    # the text after the colon and the lines in between must not pull the message elsewhere
    assert shipped.route("总结下面这段话：我们需要翻译这份文件").template == "summary"
    assert shipped.route("请帮我看看：\n我写了一首诗\n谢谢").template == "default"
    # the last line counts when the first one has no instruction
    assert shipped.route("今天开会讨论了三件事。\n预算和人手都不够。\n请总结").template == "summary"


def test_a_template_without_rules_is_only_used_when_chosen(folder: Path) -> None:
    write(folder, "pirate.yaml", template("pirate", user="Say it like a pirate: {input}"))
    store = TemplateStore(folder)
    assert store.route("Say it like a pirate").template == "default"
    assert store.route("hi", explicit="pirate").user == "Say it like a pirate: hi"


def test_on_the_demo_routing_skips_templates_that_are_off_for_it_and_names_them(folder: Path) -> None:
    write(folder, "poem.yaml", template("poem", priority="9", keywords="[poem]", route_on_demo="false"))
    write(folder, "verse.yaml", template("verse", priority="1", keywords="[verse]"))
    store = TemplateStore(folder)
    assert store.get("poem").route_on_demo is False and store.get("verse").route_on_demo is True
    assert store.route("a poem").template == "poem", "the real model: every template routes"
    skipped = store.route("a poem", demo=True)
    assert (skipped.template, skipped.reason) == ("default", Reason("demo_off", "poem"))
    assert store.route("a poem in verse", demo=True).template == "verse", "the next match answers"
    assert store.route("a verse", demo=True).reason == Reason("keyword", "verse"), (
        "a template that is on routes as always"
    )
    assert store.route("a poem", explicit="poem", demo=True).template == "poem", "chosen by name, it is used"


def test_explicit_choice_overrides_the_rules(shipped: TemplateStore) -> None:
    prompt = shipped.route("写一首诗", explicit="translation")
    assert (prompt.template, prompt.reason) == ("translation", Reason("chosen"))
    assert shipped.route("写一首诗", explicit=AUTO).template == "writing"
    assert shipped.route("写一首诗", explicit=None).template == "writing"


def test_unknown_explicit_name_lists_the_known_ones(shipped: TemplateStore) -> None:
    with pytest.raises(UnknownTemplate) as caught:
        shipped.route("hi", explicit="poetry")
    assert isinstance(caught.value, ValueError)
    assert caught.value.name == "poetry" and "summary" in caught.value.known
    assert '"poetry"' in str(caught.value) and "writing" in str(caught.value)


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        ("/summary 今天的会议很长", ("summary", "今天的会议很长")),
        ("/Translation：good night", ("translation", "good night")),
        ("  /writing\n写一封信", ("writing", "写一封信")),
        ("/default", ("default", "")),
        ("/poetry roses are red", (None, "/poetry roses are red")),
        ("/usr/bin/python 是什么", (None, "/usr/bin/python 是什么")),
        ("总结 /summary", (None, "总结 /summary")),
    ],
)
def test_split_command(shipped: TemplateStore, message: str, expected: tuple[str | None, str]) -> None:
    assert shipped.split_command(message) == expected


def test_command_then_route_uses_the_named_template(shipped: TemplateStore) -> None:
    name, rest = shipped.split_command("/summary 写一首诗")
    prompt = shipped.route(rest, explicit=name)
    assert prompt.template == "summary" and prompt.user.endswith("写一首诗") and "/summary" not in prompt.user


# ---- broken files -----------------------------------------------------------------------------------

BROKEN = [
    # (file, content, line, field, words the message must contain)
    ("syntax.yaml", 'name: syntax\nuser: "{input}"\ntemperature: [0.5\n', 3, "temperature", "not valid YAML"),
    ("tabs.yaml", 'name: tabs\n\tuser: "{input}"\n', 2, "user", "spaces, not tabs"),
    ("typo.yaml", 'name: typo\nuser: "{input}"\ntemprature: 0.5\n', 3, "temprature",
     'did you mean "temperature"'),
    ("hot.yaml", 'name: hot\ndescription: x\nuser: "{input}"\ntemperature: hot\n', 4, "temperature",
     'must be a number between 0 and 2 (got "hot")'),
    ("tokens.yaml", 'name: tokens\nuser: "{input}"\nmax_tokens: 0\n', 3, "max_tokens", "whole number"),
    ("keyword.yaml", 'name: keyword\nuser: "{input}"\nkeywords:\n  - ok\n  - 5\n', 5, "keywords",
     "item 2 must be text (got 5)"),
    ("novar.yaml", "name: novar\nuser: |\n  Task:\n  {input}\n  Tone: {tone}\n", 5, "user",
     'no variable "tone"'),
    ("nodefault.yaml", 'name: nodefault\nuser: "{input} {tone}"\nvariables:\n  tone:\n', 4, "variables.tone",
     "needs a default value"),
    ("unquoted.yaml", "name: unquoted\nuser: {input}\n", 2, "user", 'needs quotes, like user: "{input}"'),
    ("lonebrace.yaml", 'name: lonebrace\nuser: "{input} }"\n', 2, "user", "write {{ or }}"),
    ("noinput.yaml", 'name: noinput\nuser: "Hello"\n', 2, "user", "must contain {input}"),
    ("regex.yaml", 'name: regex\nuser: "{input}"\npatterns:\n  - fine\n  - "(unclosed"\n', 5, "patterns",
     "not a valid regular expression"),
    ("badname.yaml", 'name: My Template\nuser: "{input}"\n', 1, "name", "lowercase letters"),
    ("demoflag.yaml", 'name: demoflag\nuser: "{input}"\nroute_on_demo: "no"\n', 3, "route_on_demo",
     'must be true or false (got "no")'),
    ("missing.yaml", "name: missing\ndescription: no user text\n", None, "user", "is required"),
    ("empty.yaml", "", None, None, "the file is empty"),
    ("list.yaml", "- name\n- user\n", 1, None, "`field: value` lines"),
    ("latin1.yaml", b'name: latin1\nuser: "{input}"\ndescription: "caf\xe9"\n', 3, None, "not UTF-8"),
    ("binary.yaml", b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", None, None, "not a text file"),
]  # fmt: skip


@pytest.mark.parametrize(("filename", "content", "line", "field", "words"), BROKEN, ids=[b[0] for b in BROKEN])
def test_broken_file_is_reported_not_raised(
    folder: Path, filename: str, content: str | bytes, line: int | None, field: str | None, words: str
) -> None:
    write(folder, filename, content)
    write(folder, "fine.yaml", template("fine", keywords="[fine]"))
    store = TemplateStore(folder)
    [problem] = store.problems()
    text = str(problem)
    assert problem.path.endswith(filename) and text.startswith(problem.path)
    assert (problem.line, problem.field) == (line, field)
    assert (f", line {line}" in text) == (line is not None)
    assert (f', field "{field}"' in text) == (field is not None)
    assert words in text
    # the rest of the folder keeps working
    assert store.names() == ["fine", "default"]
    assert store.route("fine thanks").template == "fine"


def test_problem_text_matches_the_documented_form() -> None:
    problem = TemplateProblem("prompts/writing.yaml", 7, "temperature", 'must be a number between 0 and 2 (got "hot")')
    assert str(problem) == (
        'prompts/writing.yaml, line 7, field "temperature": must be a number between 0 and 2 (got "hot")'
    )
    assert (
        str(TemplateProblem("prompts/x.yaml", None, None, "the file is empty")) == "prompts/x.yaml: the file is empty"
    )


def test_huge_file_is_refused_by_size_before_reading(folder: Path) -> None:
    # NUL bytes would be reported as "not a text file" if the file were read, and only the check on the
    # file's size (from stat, before opening it) knows the whole size
    write(folder, "huge.yaml", b"\0" * (3 * 1024 * 1024))
    [problem] = TemplateStore(folder).problems()
    assert problem.path.endswith("huge.yaml") and problem.line is None
    assert "too large" in problem.message and f"at most {MAX_FILE_BYTES // 1024} KB" in problem.message
    assert "3072 KB" in problem.message


def test_duplicate_name_keeps_the_first_file(folder: Path) -> None:
    write(folder, "a.yaml", template("twin", user="A {input}"))
    write(folder, "b.yaml", template("twin", user="B {input}"))
    store = TemplateStore(folder)
    [problem] = store.problems()
    assert problem.path.endswith("b.yaml") and problem.line == 1 and problem.field == "name"
    assert "a.yaml" in problem.message and '"twin"' in problem.message
    assert store.route("x", explicit="twin").user == "A x"


def test_duplicate_name_stays_with_the_file_that_had_it(folder: Path) -> None:
    write(folder, "b.yaml", template("twin", user="B {input}"))
    store = TemplateStore(folder)
    write(folder, "a.yaml", template("twin", user="A {input}"))  # a copy that sorts first
    [problem] = store.problems()
    assert problem.path.endswith("a.yaml") and "b.yaml" in problem.message
    assert store.route("x", explicit="twin").user == "B x"


def test_broken_file_keeps_its_last_good_version(folder: Path) -> None:
    path = write(folder, "mood.yaml", template("mood", user="v1 {input}", keywords="[mood]"))
    store = TemplateStore(folder)
    assert store.route("mood?").user == "v1 mood?"

    write(folder, "mood.yaml", 'name: mood\nuser: "v2 {input}"\ntemperature: hot\n')
    [problem] = store.problems()
    assert problem.path.endswith("mood.yaml") and problem.field == "temperature"
    assert store.route("mood?").user == "v1 mood?"

    write(folder, "mood.yaml", template("mood", user="v3 {input}", keywords="[mood]"))
    assert store.problems() == []
    assert store.route("mood?").user == "v3 mood?"
    assert path.exists()


def test_problems_are_logged_once_with_file_line_and_field(folder: Path, caplog: pytest.LogCaptureFixture) -> None:
    write(folder, "bad.yaml", 'name: bad\nuser: "{input}"\ntop_p: 7\n')
    with caplog.at_level(logging.WARNING, logger="backend.prompts.store"):
        store = TemplateStore(folder)
        store.route("hello")
        write(folder, "other.yaml", template("other"))  # a change elsewhere must not repeat the old warning
        store.problems()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "bad.yaml, line 3" in warnings[0] and 'field "top_p"' in warnings[0]


# ---- hot reload -------------------------------------------------------------------------------------


def test_edit_add_and_delete_take_effect_on_the_next_message(folder: Path) -> None:
    write(folder, "greet.yaml", template("greet", user="Hi! {input}", keywords="[greet]"))
    store = TemplateStore(folder)
    assert store.route("greet me").user == "Hi! greet me"

    write(folder, "greet.yaml", template("greet", user="Hello! {input}", keywords="[greet]"))
    assert store.route("greet me").user == "Hello! greet me"

    write(folder, "bye.yaml", template("bye", user="Bye! {input}", keywords="[bye]"))
    assert store.route("bye now").template == "bye"
    assert "bye" in store.names()

    with_greet = store.names()
    (folder / "greet.yaml").unlink()
    assert store.route("greet me").template == "default"
    assert store.names() == [name for name in with_greet if name != "greet"], "bye and the others stay"
    with pytest.raises(UnknownTemplate):
        store.route("greet me", explicit="greet")


def test_unchanged_files_are_not_read_again(folder: Path, caplog: pytest.LogCaptureFixture) -> None:
    write(folder, "a.yaml", template("a"))
    with caplog.at_level(logging.INFO, logger="backend.prompts.store"):
        store = TemplateStore(folder)
        for _ in range(3):
            store.route("hello")
        write(folder, "a.yaml", template("a", user="again {input}"))
        store.route("hello")
    loads = [r.getMessage() for r in caplog.records if r.getMessage().startswith("loaded prompt template 'a'")]
    assert len(loads) == 2


def test_missing_folder_falls_back_to_pass_through(tmp_path: Path) -> None:
    store = TemplateStore(tmp_path / "nowhere")
    prompt = store.route("写一首诗 {x}")
    assert (prompt.template, prompt.user, prompt.system) == ("default", "写一首诗 {x}", None)
    [problem] = store.problems()
    assert "nowhere" in problem.path and "does not exist" in problem.message

    (tmp_path / "nowhere").mkdir()
    write(tmp_path / "nowhere", "default.yaml", template("default", user="[{input}]"))
    assert store.problems() == []
    assert store.route("hi").user == "[hi]"


def test_folder_without_default_uses_the_built_in_one(tmp_path: Path) -> None:
    write(tmp_path, "default.yaml", "name: default\nuser: [\n")
    write(tmp_path, "other.yaml", template("other"))
    store = TemplateStore(tmp_path)
    assert store.route("hi {x}").user == "hi {x}"
    messages = [str(problem) for problem in store.problems()]
    assert any("default.yaml, line 2" in text for text in messages)
    assert any('no usable "default" template' in text for text in messages)


# ---- the check command ------------------------------------------------------------------------------


def test_check_passes_on_a_good_folder(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["check-prompts", str(SHIPPED)]) == 0
    out = capsys.readouterr().out
    names = TemplateStore(SHIPPED).names()
    assert out == f"{len(names)} templates OK: {', '.join(names)}\n" and "summary" in names


def test_check_lists_problems_and_fails(folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write(folder, "typo.yaml", 'name: typo\nuser: "{input}"\ntemprature: 0.5\n')
    write(folder, "empty.yaml", "")
    assert cli_main(["check-prompts", str(folder)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert any("empty.yaml" in line and "empty" in line for line in lines)
    assert any('typo.yaml, line 3, field "temprature"' in line for line in lines)
    assert "2 problem(s)" in lines[-1]


def test_check_runs_as_a_command() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "backend", "check-prompts"], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "templates OK" in result.stdout

    bad = subprocess.run(
        [sys.executable, "-m", "backend", "check-prompts", str(REPO / "no-such-folder")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 1 and "does not exist" in bad.stdout


def test_unknown_template_is_a_refused_message_in_both_languages(shipped: TemplateStore) -> None:
    with pytest.raises(UnknownTemplate) as caught:
        shipped.route("hi", explicit="poetry")
    exc = caught.value
    assert (
        exc.code == "input.unknown_template"
        and exc.hint == "Choose one in the settings, or start a message with /name."
    )
    assert exc.text("zh-CN").startswith("没有名为“poetry”的模板。可用的模板：")
    assert "summary" in exc.text("zh-CN") and exc.text("zh-CN").endswith(
        "请在设置中选择一个模板，或在消息开头写 /模板名。"
    )


def test_the_workshop_form_is_the_schema() -> None:
    """The workshop's page builds its form from these (GET /workshop/api/fields): every field, in file order."""
    fields = {f["name"]: f for f in form_fields()}
    assert list(fields) == list(TemplateFile.model_fields)
    assert {name: f["kind"] for name, f in fields.items() if f["kind"] not in ("line", "number")} == {
        "keywords": "list",
        "patterns": "list",
        "system": "block",
        "user": "block",
        "variables": "mapping",
        "stop": "list",
        "route_on_demo": "choice",
        "documents": "choice",
    }
    assert fields["passages"] == {"name": "passages", "kind": "number", "range": {"ge": 0, "le": 20}}
    assert fields["temperature"]["range"] == {"ge": 0, "le": 2}
    assert fields["top_p"]["range"] == {"gt": 0, "le": 1}
    assert fields["max_tokens"]["range"] == {"ge": 1, "le": 32768}
    assert fields["priority"] == {"name": "priority", "kind": "number", "range": {}}
