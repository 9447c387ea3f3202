"""OpenAI chat-completions request and response shapes (the mapping onto a job: ``gateway.intake``)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from gateway.request_params import ID_PATTERN
from shared.jobs import JobRecord
from shared.schemas import ErrorCode, JobStatus, UsageInfo


class ImageURL(BaseModel):
    url: str
    detail: str | None = None


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["text", "image_url", "input_text", "input_image"]
    text: str | None = None
    image_url: ImageURL | str | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[ContentPart] | None = None


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")
    include_usage: bool = False


def parts(message: ChatMessage) -> list[ContentPart]:
    if message.content is None:
        return []
    if isinstance(message.content, str):
        return [ContentPart(type="text", text=message.content)]
    return message.content


def image_url(part: ContentPart) -> str | None:
    return part.image_url.url if isinstance(part.image_url, ImageURL) else part.image_url


class ChatCompletionRequest(BaseModel):
    model_config = ConfigDict(extra="allow")  # unknown OpenAI knobs are accepted and ignored
    model: str
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0, allow_inf_nan=False)
    top_p: float | None = Field(None, gt=0.0, le=1.0, allow_inf_nan=False)
    top_k: int | None = Field(None, ge=0)
    seed: int | None = Field(None, ge=0, lt=2**63)
    stop: str | list[str] | None = None
    n: int = Field(1, ge=1, le=1, description="only n=1 is supported")
    stream: bool = Field(False, strict=True)  # strict: "yes" is not true
    stream_options: StreamOptions | None = None
    user: str | None = Field(None, pattern=ID_PATTERN)
    priority: Literal["interactive", "batch"] | None = None  # vlmq's: batch runs after interactive
    min_tokens: int = Field(0, ge=0)  # vLLM's extra sampling parameters
    ignore_eos: bool = Field(False, strict=True)
    response_format: dict[str, Any] | None = None  # checked by gateway.response_format

    @field_validator("max_tokens", "max_completion_tokens", "top_k", "seed", "min_tokens", mode="before")
    @classmethod
    def _not_a_bool(cls, value: Any) -> Any:
        """JSON's ``true`` is not a count (Python's bool is an int); ``100.0`` still is."""
        if isinstance(value, bool):
            raise ValueError("Input should be a valid integer, not a boolean")
        return value


# OpenAI parameters vlmq does not implement, with the test that a value asks for them: sent with
# their neutral value (as many clients do) they are accepted; asking for them is a 400, never a
# silent answer without them.
UNSUPPORTED: dict[str, Any] = {
    "logprobs": bool,
    "top_logprobs": lambda v: v not in (None, 0),
    "tools": bool,
    "functions": bool,
    "tool_choice": lambda v: v not in (None, "none", "auto"),
    "function_call": lambda v: v not in (None, "none", "auto"),
    "logit_bias": bool,
    "presence_penalty": lambda v: v not in (None, 0),
    "frequency_penalty": lambda v: v not in (None, 0),
    "audio": bool,
    "modalities": lambda v: v not in (None, ["text"]),
    "prediction": bool,
}


def unsupported_parameter(req: ChatCompletionRequest) -> str | None:
    """The first parameter the request asks for that vlmq does not implement, or None."""
    extra = req.model_extra or {}
    return next((name for name, asks in UNSUPPORTED.items() if name in extra and asks(extra[name])), None)


def usage_json(record_usage: Any) -> dict[str, Any]:
    usage = record_usage
    if usage is None:
        return {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
    }


def completion_json(
    job_id: str,
    model: str,
    created_at: float,
    text: str | None,
    finish_reason: str | None,
    usage: UsageInfo | None,
) -> dict[str, Any]:
    return {
        "id": f"chatcmpl-{job_id}",
        "object": "chat.completion",
        "created": int(created_at),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text or ""},
                "logprobs": None,
                "finish_reason": finish_reason or "stop",
            }
        ],
        "usage": usage_json(usage),
        "system_fingerprint": None,
    }


def completion_json_of(job_id: str, model: str, record: JobRecord) -> dict[str, Any]:
    """The completion of a finished job, from its record."""
    return completion_json(job_id, model, record.created_at, record.text, record.finish_reason, record.usage)


def chunk_json(
    job_id: str,
    model: str,
    created: int,
    delta: dict[str, Any],
    finish_reason: str | None = None,
    usage: dict[str, Any] | None = None,
    choices: bool = True,
) -> dict[str, Any]:
    chunk: dict[str, Any] = {
        "id": f"chatcmpl-{job_id}",
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "system_fingerprint": None,
        "choices": [],
    }
    if choices:
        chunk["choices"] = [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}]
    if usage is not None:
        chunk["usage"] = usage
    return chunk


TERMINAL_HTTP: dict[str, tuple[int, str]] = {
    ErrorCode.BAD_IMAGE: (400, "the image could not be decoded"),
    ErrorCode.IMAGE_EXPIRED: (400, "the image expired before it was used; send it again"),
    ErrorCode.INVALID_REQUEST: (400, "the request was refused"),
    ErrorCode.EXPIRED: (408, "deadline passed before the answer was complete"),
    ErrorCode.CANCELLED: (499, "the job was cancelled"),
    ErrorCode.QUEUE_UNAVAILABLE: (503, "decode queue unavailable, retry shortly"),
    ErrorCode.INTERNAL: (500, "generation failed"),
}
_BY_STATUS = {JobStatus.EXPIRED: ErrorCode.EXPIRED, JobStatus.CANCELLED: ErrorCode.CANCELLED}


def terminal_error(status: JobStatus, code: str | None, error: str | None) -> tuple[int, str, str]:
    """(HTTP status, message, error code) of a job that did not end done."""
    code = code or _BY_STATUS.get(status, ErrorCode.INTERNAL)
    http, message = TERMINAL_HTTP.get(code, TERMINAL_HTTP[ErrorCode.INTERNAL])
    return http, f"{message}: {error}" if error else message, code
