"""How the API refuses: the status, the OpenAI-style error object and the retry headers of each kind of refusal."""

from __future__ import annotations

from backend.api.router import error_body, retry_headers
from backend.errors import ApiError, QuotaError, ServerFullError, ServerRestartingError


def test_a_quota_used_up_for_the_day_says_do_not_retry_until_its_reset() -> None:
    used_up = QuotaError.of("quota.tokens", limit=1000, used=1000, retry_s=3600)
    status, body = error_body(used_up, "en")
    assert status == 429 and body["error"]["type"] == "insufficient_quota" and body["error"]["code"] == "quota.tokens"
    assert retry_headers(used_up) == {"Retry-After": "3600", "x-should-retry": "false"}


def test_places_and_the_minutes_rate_are_worth_a_retry_soon() -> None:
    for code, params in (
        ("quota.concurrent", {"limit": 2, "retry_s": 5}),
        ("quota.rate", {"limit": 30, "retry_s": 12}),
    ):
        exc = QuotaError.of(code, **params)
        status, body = error_body(exc, "en")
        assert status == 429 and body["error"]["type"] == "rate_limit_error"
        assert retry_headers(exc) == {"Retry-After": str(params["retry_s"])}, "no x-should-retry: the client retries"


def test_a_full_line_and_a_restart_answer_503_with_when_to_try_again() -> None:
    full = ServerFullError.of("admission.full", waiting=64, retry_s=20)
    restarting = ServerRestartingError.of("admission.restarting", retry_s=60)
    for exc, seconds in ((full, "20"), (restarting, "60")):
        status, body = error_body(exc, "zh-CN")
        assert status == 503 and body["error"]["code"] == exc.code and "秒" in body["error"]["message"]
        assert retry_headers(exc) == {"Retry-After": seconds}
    assert retry_headers(ApiError.of("api.bad_request", detail="x")) is None
