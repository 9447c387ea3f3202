"""Client-facing request parameters (``/v1/jobs`` and ``/v1/chat/ws``), validated by pydantic.

Limits that depend on settings (prompt length, max_tokens) are checked in ``check_limits``.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from gateway.errors import APIError, validation_message
from shared.config import GatewaySettings

SESSION_ID_PATTERN = r"^[A-Za-z0-9_.:-]{1,128}$"


class JobParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    prompt: str = Field(min_length=1, description="The question about the image")
    system: str | None = Field(None, description="System prompt, fixed when a session starts")
    session_id: str | None = Field(None, pattern=SESSION_ID_PATTERN)
    max_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(0.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=0)
    seed: int | None = Field(None, ge=0, lt=2**63)
    stop: list[str] = Field(default_factory=list, max_length=8)
    timeout_s: float | None = Field(None, gt=0, le=86_400)
    use_cache: bool = True
    cancel_on_disconnect: bool = False
    image: str | None = Field(None, description="base64 or data: URL (JSON and WebSocket only)")

    @field_validator("stop", mode="before")
    @classmethod
    def _one_stop(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    @field_validator("stop")
    @classmethod
    def _no_empty_stop(cls, value: list[str]) -> list[str]:
        if any(not s for s in value):
            raise ValueError("stop strings must not be empty")
        return value


def parse_params(raw: dict[str, Any]) -> JobParams:
    """dict (JSON body, form fields, WS message) -> JobParams, or 422 with a readable message."""
    try:
        params = JobParams.model_validate(raw)
    except ValidationError as exc:
        message, param = validation_message(list(exc.errors()))
        raise APIError(422, message, param=param) from None
    if not params.prompt.strip():
        raise APIError(422, "prompt: must not be blank", param="prompt")
    return params


def check_limits(params: JobParams, settings: GatewaySettings) -> None:
    if len(params.prompt) > settings.max_prompt_chars:
        raise APIError(422, f"prompt: longer than {settings.max_prompt_chars} characters", param="prompt")
    if params.system is not None and len(params.system) > settings.max_prompt_chars:
        raise APIError(422, f"system: longer than {settings.max_prompt_chars} characters", param="system")
    if params.max_tokens is not None and params.max_tokens > settings.max_tokens_limit:
        raise APIError(422, f"max_tokens: at most {settings.max_tokens_limit}", param="max_tokens")
