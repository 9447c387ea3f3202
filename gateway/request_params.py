"""Client-facing request parameters, validated by pydantic.

``GenerationOptions`` are the sampling knobs every route shares; ``JobParams`` adds what the jobs
route and the chat WebSocket take (a prompt in a stored conversation). Limits that depend on
settings (text length, max_tokens) are checked in ``check_text`` and ``check_max_tokens``: cheap
checks only (characters, turns); token counts belong to the inference worker.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from gateway.errors import APIError, validation_message
from shared import log_context
from shared.config import GatewaySettings

ID_PATTERN = r"^[A-Za-z0-9_.:-]{1,128}$"  # conversation ids and affinity keys
_CLIENT_ID = re.compile(ID_PATTERN)
_JOB_ID = re.compile(r"[0-9a-f]{32}")  # uuid4().hex, as gateway.job_spec.new_id makes them


class GenerationOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    max_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(0.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=0)
    seed: int | None = Field(None, ge=0, lt=2**63)
    stop: list[str] = Field(default_factory=list, max_length=8)
    min_tokens: int = Field(
        0, ge=0, description="No end of answer (EOS or a stop string) before this many tokens (vLLM's)"
    )
    ignore_eos: bool = Field(False, description="Keep generating past EOS, up to max_tokens (vLLM's)")

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


class JobParams(GenerationOptions):
    """``POST /v1/jobs`` fields and ``/v1/chat/ws`` messages (the image travels apart)."""

    prompt: str = Field(min_length=1, description="The question about the image")
    system: str | None = Field(None, description="System prompt, fixed when a conversation starts")
    session_id: str | None = Field(None, pattern=ID_PATTERN, description="The conversation to continue")
    timeout_s: float | None = Field(None, gt=0, le=86_400)
    use_cache: bool = True
    cancel_on_disconnect: bool = False
    priority: Literal["interactive", "batch"] | None = Field(
        None, description="batch runs after interactive work (default: the API key's)"
    )


def validated(model: type[GenerationOptions], raw: dict[str, Any]) -> Any:
    """dict (JSON body, form fields, WS message) -> ``model``, or 422 with a readable message."""
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        message, param = validation_message(list(exc.errors()))
        raise APIError(422, message, param=param) from None


def parse_params(raw: dict[str, Any], settings: GatewaySettings) -> JobParams:
    params: JobParams = validated(JobParams, raw)
    if not params.prompt.strip():
        raise APIError(422, "prompt: must not be blank", param="prompt")
    check_text("prompt", params.prompt, settings)
    if params.system is not None:
        check_text("system", params.system, settings)
    check_max_tokens(params, settings)
    return params


def check_text(field: str, text: str, settings: GatewaySettings) -> None:
    if len(text) > settings.max_prompt_chars:
        raise APIError(422, f"{field}: longer than {settings.max_prompt_chars} characters", param=field)


def check_max_tokens(options: GenerationOptions, settings: GatewaySettings) -> None:
    if options.max_tokens is not None and options.max_tokens > settings.max_tokens_limit:
        raise APIError(422, f"max_tokens: at most {settings.max_tokens_limit}", param="max_tokens")
    max_tokens = options.max_tokens or settings.default_max_tokens
    if options.min_tokens > max_tokens:
        message = f"min_tokens: at most max_tokens ({max_tokens}), got {options.min_tokens}"
        raise APIError(422, message, param="min_tokens")


def check_job_id(job_id: str) -> str:
    """404 for an id we could never have made, without asking Redis."""
    if _JOB_ID.fullmatch(job_id) is None:
        raise APIError(
            404,
            f"job {shown(job_id)} not found: job ids are 32 lowercase hex digits",
            param="id",
            code="job_not_found",
        )
    log_context.bind(job_id)  # the request's later log lines name the job
    return job_id


def valid_conversation_id(session_id: str) -> bool:
    return _CLIENT_ID.fullmatch(session_id) is not None


def shown(value: str, limit: int = 64) -> str:
    """A client's value quoted in an error message: cut to ``limit`` characters, ASCII only (it may
    end up in a WebSocket close reason, which has a byte limit)."""
    return ascii(value if len(value) <= limit else value[:limit] + "...")
