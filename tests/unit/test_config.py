"""Configuration: defaults, environment overrides, and errors that name the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from backend.config import DEFAULT_CONFIG_PATH, EngineFlags, load_config
from backend.errors import ConfigError


def test_shipped_config_loads_with_profiles() -> None:
    cfg = load_config(environ={})
    assert cfg.model.id == "baidu/ERNIE-4.5-0.3B-PT"
    assert cfg.server.host == "127.0.0.1"
    assert {"cpu", "gpu"} <= set(cfg.profiles)
    assert cfg.profiles["cpu"].enforce_eager is True


def test_environment_overrides_are_typed_and_nested() -> None:
    cfg = load_config(
        environ={
            "ERNIE_SERVER__PORT": "8200",
            "ERNIE_ENGINE__NAME": "vllm-cpu",
            "ERNIE_ENGINE__FLAGS__MAX_MODEL_LEN": "1024",
            "ERNIE_ENGINE__FLAGS__ENFORCE_EAGER": "false",
            "ERNIE_CHAT__TEMPERATURE": "0.2",
        }
    )
    assert cfg.server.port == 8200
    assert cfg.engine.name == "vllm-cpu"
    assert cfg.engine.flags.max_model_len == 1024
    assert cfg.engine.flags.enforce_eager is False
    assert cfg.chat.temperature == pytest.approx(0.2)


def test_invalid_env_value_names_key_and_variable() -> None:
    with pytest.raises(ConfigError) as err:
        load_config(environ={"ERNIE_SERVER__PORT": "eighty"})
    text = str(err.value)
    assert "server.port" in text and "ERNIE_SERVER__PORT" in text and "'eighty'" in text


def test_out_of_range_value_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"chat\.temperature"):
        load_config(environ={"ERNIE_CHAT__TEMPERATURE": "7"})


def test_unknown_env_section_is_refused() -> None:
    with pytest.raises(ConfigError, match="ERNIE_SERVRE__PORT"):
        load_config(environ={"ERNIE_SERVRE__PORT": "1"})


def test_unknown_key_in_file_names_it(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("server:\n  prot: 8100\n")
    with pytest.raises(ConfigError) as err:
        load_config(path, environ={})
    assert "server.prot" in str(err.value) and "unknown key" in str(err.value)


def test_bad_yaml_reports_line(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("server:\n  port: 8100\n engine: [\n")
    with pytest.raises(ConfigError, match=r"line \d+"):
        load_config(path, environ={})


def test_missing_explicit_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(environ={"ERNIE_CONFIG": str(tmp_path / "nope.yaml")})


def test_unknown_profile_is_refused() -> None:
    with pytest.raises(ConfigError, match="turbo"):
        load_config(environ={"ERNIE_ENGINE__PROFILE": "turbo"})


def test_backoff_order_is_checked() -> None:
    with pytest.raises(ConfigError, match="backoff_max_s"):
        load_config(environ={"ERNIE_RESTART__BACKOFF_INITIAL_S": "100", "ERNIE_RESTART__BACKOFF_MAX_S": "10"})


def test_default_path_is_the_shipped_file() -> None:
    assert DEFAULT_CONFIG_PATH.exists()


def test_config_errors_read_in_chinese_with_key_and_value_kept() -> None:
    with pytest.raises(ConfigError) as err:
        load_config(environ={"ERNIE_SERVER__PORT": "eighty", "ERNIE_CHAT__TEMPERATURE": "7"})
    exc = err.value
    assert exc.code == "config.invalid"
    zh = exc.text("zh-CN")
    assert "server.port：应为整数，实际为 'eighty'（由 ERNIE_SERVER__PORT 设置）" in zh
    assert "chat.temperature：应小于或等于 2，实际为 7（由 ERNIE_CHAT__TEMPERATURE 设置）" in zh
    assert zh.startswith("配置无效（") and "请改正这些值" in zh
    assert "Input should be a valid integer" in str(exc)  # pydantic's own words in English


def test_config_errors_in_a_file_read_in_chinese(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("server:\n  prot: 8100\n")
    with pytest.raises(ConfigError) as err:
        load_config(path, environ={})
    assert "server.prot：未知的配置项，实际为 8100（位于 c.yaml）" in err.value.text("zh-CN")
    path.write_text("- a list\n")
    with pytest.raises(ConfigError) as err:
        load_config(path, environ={})
    assert err.value.hint and err.value.text("zh-CN").startswith(f"{path}：顶层必须是由各个配置节组成的映射。")
    path.write_text("server:\n  port: 8100\n engine: [\n")
    with pytest.raises(ConfigError) as err:
        load_config(path, environ={})
    assert err.value.text("zh-CN").startswith(f"{path}，第 3 行：不是有效的 YAML（")


def test_unknown_profile_reads_in_chinese() -> None:
    with pytest.raises(ConfigError) as err:
        load_config(environ={"ERNIE_ENGINE__PROFILE": "turbo"})
    assert "engine.profile 'turbo' is not defined (known: " in str(err.value)
    assert "engine.profile 'turbo' 未定义（已定义的：" in err.value.text("zh-CN")


def test_merged_flags_replace_what_the_override_sets_and_leave_the_rest_unset() -> None:
    profile = EngineFlags(max_model_len=4096, max_num_seqs=16, cpu_kvcache_space_gib=2, dtype="bfloat16")
    user = EngineFlags(max_num_seqs=8).merged(EngineFlags(dtype="float32"))
    assert user.model_fields_set == {"max_num_seqs", "dtype"}, "what neither sets stays unset"
    served = profile.merged(user)
    assert (served.max_model_len, served.max_num_seqs, served.cpu_kvcache_space_gib, served.dtype) == (
        4096,
        8,
        2,
        "float32",
    ), "a merged override keeps the profile's values it does not set (the KV space among them)"
    assert served.quantization is None and served.extra_args == []
