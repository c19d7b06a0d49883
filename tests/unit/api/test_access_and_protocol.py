"""Who may call the API (keys with login; this machine only without), the OpenAI shapes, and how errors become
OpenAI error objects with the app's codes and a Retry-After over a quota."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest
from fastapi import Request

from backend.api.access import LOCAL_USER, ApiAccess, api_enabled
from backend.api.protocol import CompletionRequest
from backend.api.router import refusal, status_of
from backend.api.serving import ApiServing, split_messages
from backend.errors import ApiError, BackendUnavailableError, InvalidInputError, QuotaError
from tests.conftest import MakeConfig


def request(client: str = "127.0.0.1", host: str = "127.0.0.1:8501", **headers: str) -> Request:
    raw = [(b"host", host.encode())] + [(k.replace("_", "-").encode(), v.encode()) for k, v in headers.items()]
    return Request({"type": "http", "method": "GET", "path": "/v1/models", "headers": raw, "client": (client, 5000),
                    "query_string": b""})  # fmt: skip


class Keys:
    def __init__(self, owners: dict[str, str]) -> None:
        self.owners = owners

    async def owner(self, key: str) -> str | None:
        return self.owners.get(key)


class Accounts:
    def role(self, name: str) -> str | None:
        return {"alice": "user", "ada": "admin"}.get(name)


def test_the_api_is_on_with_login_and_off_without_unless_asked(make_config: MakeConfig) -> None:
    assert api_enabled(make_config(auth__enabled="true"))
    assert not api_enabled(make_config())
    assert api_enabled(make_config(api__enabled="true"))
    assert not api_enabled(make_config(auth__enabled="true", api__enabled="false"))


async def test_without_login_only_this_machine_and_only_when_on(make_config: MakeConfig) -> None:
    off = ApiAccess(make_config(), None, None)
    with pytest.raises(ApiError) as refused:
        await off.caller(request())
    assert refused.value.code == "api.off"
    on = ApiAccess(make_config(api__enabled="true"), None, None)
    assert (await on.caller(request())).user == LOCAL_USER
    for remote in (request(client="10.0.0.5"), request(host="evil.example:8501")):
        with pytest.raises(ApiError) as refused:
            await on.caller(remote)
        assert refused.value.code == "api.remote"


async def test_with_login_a_key_of_a_known_user(make_config: MakeConfig) -> None:
    keys = Keys({"ek-alice": "alice", "ek-gone": "removed-user"})
    access = ApiAccess(make_config(auth__enabled="true"), keys, Accounts())  # type: ignore[arg-type]
    caller = await access.caller(request(authorization="Bearer ek-alice"))
    assert (caller.user, caller.role) == ("alice", "user")
    for headers, code in [({}, "api.no_key"), ({"authorization": "Bearer ek-wrong"}, "api.bad_key"),
                          ({"authorization": "Bearer ek-gone"}, "api.bad_key")]:  # fmt: skip
        with pytest.raises(ApiError) as refused:
            await access.caller(request(**headers))
        assert refused.value.code == code


def test_the_key_page_takes_only_logged_in_calls(make_config: MakeConfig) -> None:
    """Another site's page never gets here: backend.web.guard refuses it (tests/unit/web/test_guard.py)."""
    access = ApiAccess(make_config(auth__enabled="true"), None, Accounts(), identify=lambda r: "ada")  # type: ignore[arg-type]
    assert access.browser_user(request(origin="http://127.0.0.1:8501")).role == "admin"
    nobody = ApiAccess(make_config(auth__enabled="true"), None, Accounts(), identify=lambda r: None)  # type: ignore[arg-type]
    with pytest.raises(ApiError):
        nobody.browser_user(request())


def body(**fields: Any) -> CompletionRequest:
    return CompletionRequest.model_validate({"model": "m", "messages": [{"role": "user", "content": "Hi"}]} | fields)


def test_messages_become_history_text_and_the_caller_s_system_text() -> None:
    history, text, system = split_messages(body(messages=[
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "One"}]},
        {"role": "assistant", "content": "1"},
        {"role": "user", "content": "Two"},
    ]))  # fmt: skip
    assert history == [{"role": "user", "content": "One"}, {"role": "assistant", "content": "1"}]
    assert (text, system) == ("Two", "Be brief.")
    assert split_messages(body())[2] is None, "no system text: the template's"
    with pytest.raises(ApiError) as refused:
        split_messages(body(messages=[{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A"}]))
    assert refused.value.code == "api.bad_request"


def test_sampling_takes_what_the_caller_set() -> None:
    assert body(temperature=0, max_completion_tokens=9).sampling() == {"temperature": 0, "max_tokens": 9}
    assert body(n=1, user="x").sampling() == {}, "fields tools add are accepted"
    assert body(n=1, seed=3, ignore_eos=True).engine_options() == {"seed": 3, "ignore_eos": True}


def test_model_names_pick_the_template() -> None:
    service = SimpleNamespace(
        serving=lambda: SimpleNamespace(model="ERNIE"), templates=SimpleNamespace(names=lambda: ["code", "chat"])
    )
    serving = ApiServing(service)  # type: ignore[arg-type]
    assert serving.models() == ["ERNIE", "ERNIE:code", "ERNIE:chat"]
    assert serving.template_of(body(model="ERNIE")) is None
    assert serving.template_of(body(model="ERNIE:code")) == "code"
    assert serving.template_of(body(model="code")) == "code"
    assert serving.template_of(body(model="ERNIE", template="chat")) == "chat"
    with pytest.raises(ApiError) as refused:
        serving.template_of(body(model="gpt-4o"))
    assert refused.value.code == "api.unknown_model" and "ERNIE:code" in refused.value.message


def test_errors_are_openai_error_objects_with_the_app_s_codes() -> None:
    assert status_of(ApiError.of("api.bad_key")) == 401
    assert status_of(InvalidInputError.of("input.empty")) == 400
    assert status_of(BackendUnavailableError.of("engine.not_ready", seconds=5)) == 503
    over = refusal(QuotaError.of("quota.rate", limit=2, retry_s=17), request(accept_language="zh-CN"))
    assert over.status_code == 429 and over.headers["retry-after"] == "17"
    error = json.loads(bytes(over.body))["error"]
    assert error["code"] == "quota.rate" and error["type"] == "rate_limit_error" and "17 秒" in error["message"]
