"""OpenAI chat-completions request/response shapes, and their mapping onto a ``JobSpec``.

OpenAI clients resend the whole conversation each turn, so ``JobSpec.messages`` is built
from the request; a session id (``user`` or ``X-Session-Id``) only gives cache affinity.
One image per conversation (``JobSpec`` carries one digest), as a ``data:`` URL.
"""

from __future__ import annotations

import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from gateway.errors import APIError
from gateway.images import ImageInfo, decode_base64_image_async, inspect_image_async
from gateway.params import SESSION_ID_PATTERN, JobParams, check_limits
from gateway.submission import PreparedJob, new_id, sampling_spec
from shared.config import GatewaySettings
from shared.jobs import JobRecord
from shared.schemas import ChatTurn, JobSpec


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


class ChatCompletionRequest(BaseModel):
    model_config = ConfigDict(extra="allow")  # unknown OpenAI knobs are accepted and ignored
    model: str
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=0)
    seed: int | None = Field(None, ge=0, lt=2**63)
    stop: str | list[str] | None = None
    n: int = Field(1, ge=1, le=1, description="only n=1 is supported")
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = Field(None, pattern=SESSION_ID_PATTERN)


def _parts(message: ChatMessage) -> list[ContentPart]:
    if message.content is None:
        return []
    if isinstance(message.content, str):
        return [ContentPart(type="text", text=message.content)]
    return message.content


def _image_url(part: ContentPart, where: str) -> str:
    url = part.image_url.url if isinstance(part.image_url, ImageURL) else part.image_url
    if not url:
        raise APIError(400, f"{where}: image_url.url is required", param=where)
    return url


async def build_turns(
    req: ChatCompletionRequest, settings: GatewaySettings
) -> tuple[list[ChatTurn], ImageInfo, bytes]:
    """Messages -> ChatTurns; exactly one (distinct) image, in a user turn."""
    turns: list[ChatTurn] = []
    image: tuple[ImageInfo, bytes] | None = None
    for i, message in enumerate(req.messages):
        texts, has_image = [], False
        for j, part in enumerate(_parts(message)):
            where = f"messages[{i}].content[{j}]"
            if part.type in ("text", "input_text"):
                texts.append(part.text or "")
                continue
            if message.role != "user":
                raise APIError(400, f"{where}: images are only accepted in user messages", param=where)
            data = await decode_base64_image_async(_image_url(part, where), settings.max_image_bytes, where)
            info = await inspect_image_async(data, settings.max_image_bytes, settings.max_image_pixels, where)
            if image is not None and image[0].digest != info.digest:
                raise APIError(400, f"{where}: only one image per conversation is supported", param=where)
            has_image = has_image or image is None
            image = image or (info, data)
        role = "system" if message.role == "developer" else message.role
        turns.append(ChatTurn(role=role, text="\n".join(texts), image=has_image))
    if turns[-1].role != "user":
        raise APIError(400, "messages: the last message must be from the user", param="messages")
    if image is None:
        raise APIError(
            400,
            "messages: an image is required (an image_url content part with a data: URL)",
            param="messages",
            code="image_required",
        )
    return turns, image[0], image[1]


async def prepare_openai_job(
    req: ChatCompletionRequest, settings: GatewaySettings, session_id: str | None
) -> PreparedJob:
    if req.model != settings.model_name:
        raise APIError(
            404,
            f"model {req.model!r} not found; this server serves {settings.model_name!r}",
            param="model",
            code="model_not_found",
        )
    turns, info, data = await build_turns(req, settings)
    stop = [req.stop] if isinstance(req.stop, str) else (req.stop or [])
    # Greedy unless the client asks to sample: answers stay reproducible and cacheable.
    params = JobParams.model_validate(
        {
            "prompt": turns[-1].text or " ",
            "max_tokens": req.max_completion_tokens or req.max_tokens,
            "temperature": req.temperature or 0.0,
            "top_p": req.top_p or 1.0,
            "top_k": req.top_k or 0,
            "seed": req.seed,
            "stop": stop,
        }
    )
    check_limits(params, settings)
    for turn in turns:
        if len(turn.text) > settings.max_prompt_chars:
            raise APIError(
                422,
                f"messages: a message is longer than {settings.max_prompt_chars} characters",
                param="messages",
            )
    now = time.time()
    spec = JobSpec(
        job_id=new_id(),
        created_at=now,
        image_digest=info.digest,
        image_format=info.format,
        messages=turns,
        sampling=sampling_spec(params, settings.default_max_tokens),
        session_id=session_id or req.user,
        cancel_on_disconnect=True,
        source="openai",
    )
    return PreparedJob(spec=spec, image=info, image_bytes=data)


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


def completion_json(job_id: str, model: str, record: JobRecord) -> dict[str, Any]:
    return {
        "id": f"chatcmpl-{job_id}",
        "object": "chat.completion",
        "created": int(record.created_at),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": record.text or ""},
                "logprobs": None,
                "finish_reason": record.finish_reason or "stop",
            }
        ],
        "usage": usage_json(record.usage),
        "system_fingerprint": None,
    }


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
