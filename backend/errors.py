"""Errors a user can meet. Each says what happened and what to do; the chat shows it as a short message."""

from __future__ import annotations


class ServiceError(Exception):
    """Base of every error meant for a person: `str()` is the full message, `hint` what to do next."""

    #: key of the translated chat message in backend.chat.i18n (falls back to the English text)
    key = "error.generic"

    def __init__(self, message: str, hint: str = "", **params: object) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.params = params

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

    def __init__(self, message: str, hint: str = "", exit_code: int | None = None, log_tail: str = "") -> None:
        super().__init__(message, hint)
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
    """The message cannot be sent as it is (empty, or too large to accept)."""

    key = "error.input"


class BenchmarkError(ServiceError):
    """The benchmark cannot run as asked (bad option, server not reachable, engine or baseline failed)."""

    key = "error.benchmark"
