"""Every request shape -> one ``Submission``: a multipart form or a JSON body (``POST /v1/jobs``),
a chat WebSocket message, an OpenAI chat-completions request.

Everything a client can get wrong is refused here, before anything is stored: parameters (422),
the image (read and checked once, ``image_checks.read_image``), the model name. What a job then
needs from Redis (the stored conversation) is ``gateway.job_spec``'s part.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from starlette.datastructures import UploadFile
from starlette.requests import Request

from gateway.errors import APIError
from gateway.image_checks import CheckedImage, read_image, read_upload
from gateway.keyring import Priority, Tenant
from gateway.openai_schema import (
    ChatCompletionRequest,
    ChatMessage,
    ContentPart,
    image_url,
    parts,
    unsupported_parameter,
)
from gateway.request_params import GenerationOptions, check_max_tokens, parse_params, validated
from gateway.response_format import parse_response_format
from shared.config import GatewaySettings
from shared.schemas import ChatTurn, ResponseFormat

Source = Literal["jobs", "ws", "openai"]
MAX_FORM_FIELDS = 32
FORM_TYPES = ("multipart/form-data", "application/x-www-form-urlencoded")  # a follow-up needs no file


@dataclass(frozen=True)
class NextTurn:
    """A question in a stored conversation (jobs route, chat WebSocket)."""

    prompt: str
    system: str | None
    conversation_id: str | None  # None: a new conversation


@dataclass(frozen=True)
class WholeConversation:
    """A conversation the client resends whole each turn (OpenAI): nothing is stored for it."""

    turns: list[ChatTurn]
    affinity_key: str | None  # keeps the engine's session KV between the client's turns


@dataclass(frozen=True)
class Submission:
    source: Source  # a metrics label; nothing behaves differently by it
    ask: NextTurn | WholeConversation
    options: GenerationOptions
    images: list[CheckedImage] = field(default_factory=list)  # new uploads, each once, in order
    response_format: ResponseFormat | None = None  # None: free text
    timeout_s: float | None = None
    use_cache: bool = True
    cancel_on_disconnect: bool = False
    use_result_cache: bool = True
    priority: Priority | None = None  # asked for (None: the tenant's default)
    tenant: Tenant | None = None  # who asks (None: an open gateway); set by the route

    def by(self, tenant: Tenant | None) -> Submission:
        return replace(self, tenant=tenant)


# --- POST /v1/jobs ---
async def from_http(request: Request, settings: GatewaySettings, no_cache: bool) -> Submission:
    """Multipart (file or base64 in ``image``) or JSON (``image`` as base64 / data URL)."""
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type in FORM_TYPES:
        raw, images = await _read_form(request, settings.max_images_per_request)
    elif content_type in ("application/json", ""):
        raw = await _read_json(request)
        images = _image_field(raw.pop("image", None))
    else:
        raise APIError(
            415,
            f"unsupported content type {content_type!r}; send a form (multipart with a file) or JSON",
            code="unsupported_content_type",
        )
    return await _job_submission("jobs", raw, images, settings, use_result_cache=not no_cache)


async def _read_form(request: Request, max_images: int) -> tuple[dict[str, Any], list[bytes | str]]:
    """Fields, and every ``image`` field (files or base64 text) in order. One file more than the
    limit is read, so that the refusal says how many the limit is."""
    async with request.form(max_files=max_images + 1, max_fields=MAX_FORM_FIELDS) as form:
        raw: dict[str, Any] = {}
        images: list[bytes | str] = []
        for name in form:
            values = form.getlist(name)
            if name != "image":
                _form_field(raw, name, values)
                continue
            for value in values:  # an empty file is refused as such; an empty text field is no image
                if isinstance(value, UploadFile):
                    images.append(await read_upload(value))
                elif value:
                    images.append(str(value))
    return raw, images


def _form_field(raw: dict[str, Any], name: str, values: list[Any]) -> None:
    if name == "stop":
        raw["stop"] = [str(v) for v in values]
    elif len(values) > 1 or isinstance(values[0], UploadFile):
        raise APIError(400, f"{name}: expected one text value", param=name)
    else:
        raw[name] = values[0]


async def _read_json(request: Request) -> dict[str, Any]:
    return parse_json_object(await request.body(), "body")


def parse_json_object(body: bytes | str, what: str) -> dict[str, Any]:
    """A JSON object (jobs route body, chat WebSocket message), else 400 saying what is wrong."""
    try:
        raw = json.loads(body or b"{}")
    except ValueError:  # UnicodeDecodeError (not UTF-8) is one too
        raise APIError(400, f"{what} is not valid UTF-8 JSON", code="bad_json") from None
    except RecursionError:
        raise APIError(400, f"{what} is nested too deeply", code="bad_json") from None
    if not isinstance(raw, dict):
        raise APIError(400, f"{what} must be a JSON object", code="bad_json")
    return raw


# --- /v1/chat/ws ---
async def from_ws_message(message: dict[str, Any], settings: GatewaySettings) -> Submission:
    """A job message; ``no_cache: true`` is the WebSocket's ``Cache-Control: no-cache``."""
    raw = {k: v for k, v in message.items() if k != "type"}
    raw.setdefault("cancel_on_disconnect", True)  # page closed: stop generating for nobody
    no_cache = raw.pop("no_cache", False) is True
    images = _image_field(raw.pop("image", None))
    return await _job_submission("ws", raw, images, settings, use_result_cache=not no_cache)


def _image_field(value: Any) -> list[bytes | str]:
    """JSON ``image``: one base64 string or data URL, or a list of them (several images)."""
    values = value if isinstance(value, list) else [value] if value is not None else []
    if not all(isinstance(v, str) for v in values):
        raise APIError(
            400, "image: expected a base64 string or a data: URL, or a list of them", param="image"
        )
    return [v for v in values if v]


async def read_images(
    values: Sequence[bytes | str], settings: GatewaySettings, fields: list[str] | None = None
) -> list[CheckedImage]:
    """One checked image per value, in order (a value sent twice is read once); more than
    ``max_images_per_request`` is a 400 before any is read."""
    limit = settings.max_images_per_request
    if len(values) > limit:
        raise APIError(
            400,
            f"image: {len(values)} images exceed the limit of {limit} per request",
            param="image",
            code="too_many_images",
        )
    read: dict[bytes | str, CheckedImage] = {}
    for i, value in enumerate(values):
        if value not in read:
            read[value] = await read_image(value, settings, fields[i] if fields else "image")
    return [read[value] for value in values]


def distinct(images: list[CheckedImage]) -> list[CheckedImage]:
    """Each image once (by digest), in order of first appearance."""
    return list({image.info.digest: image for image in images}.values())


async def _job_submission(
    source: Source,
    raw: dict[str, Any],
    images: list[bytes | str],
    settings: GatewaySettings,
    use_result_cache: bool,
) -> Submission:
    response_format = raw.pop("response_format", None)
    params = parse_params(raw, settings)
    return Submission(
        source=source,
        ask=NextTurn(params.prompt, params.system, params.session_id),
        options=GenerationOptions.model_validate(
            params.model_dump(include=set(GenerationOptions.model_fields))
        ),
        response_format=parse_response_format(response_format, params.stop, params.min_tokens),
        images=distinct(await read_images(images, settings)),
        timeout_s=params.timeout_s,
        use_cache=params.use_cache,
        cancel_on_disconnect=params.cancel_on_disconnect,
        use_result_cache=use_result_cache,
        priority=params.priority,
    )


# --- POST /v1/chat/completions ---
async def from_openai(
    req: ChatCompletionRequest, settings: GatewaySettings, affinity_key: str | None, no_cache: bool
) -> Submission:
    """The request's messages become the job's conversation (text only, or images in user turns)."""
    if req.model != settings.model_name:
        raise APIError(
            404,
            f"model {req.model!r} not found; this server serves {settings.model_name!r}",
            param="model",
            code="model_not_found",
        )
    options: GenerationOptions = validated(
        GenerationOptions,
        {
            "max_tokens": req.max_completion_tokens or req.max_tokens,
            # Greedy unless the client asks to sample: answers stay reproducible and cacheable.
            "temperature": req.temperature or 0.0,
            "top_p": req.top_p or 1.0,
            "top_k": req.top_k or 0,
            "seed": req.seed,
            "stop": req.stop or [],
            "min_tokens": req.min_tokens,
            "ignore_eos": req.ignore_eos,
        },
    )
    check_max_tokens(options, settings)
    check_conversation_size(req.messages, settings)
    check_openai_request(req)
    response_format = parse_response_format(req.response_format, options.stop, options.min_tokens)
    turns, images = await _openai_turns(req.messages, settings)
    return Submission(
        source="openai",
        ask=WholeConversation(turns, affinity_key or req.user),
        options=options,
        response_format=response_format,
        images=images,
        cancel_on_disconnect=True,
        use_result_cache=not no_cache,
        priority=req.priority,
    )


def check_openai_request(req: ChatCompletionRequest) -> None:
    """A parameter vlmq does not implement, or a last user message that asks nothing: 400."""
    if name := unsupported_parameter(req):
        raise APIError(400, f"{name}: not supported by this server", param=name, code="unsupported_parameter")
    last = req.messages[-1]
    if last.role == "user" and not any(_asks(part) for part in parts(last)):
        where = f"messages[{len(req.messages) - 1}].content"
        raise APIError(400, f"{where}: the last user message is empty", param=where, code="empty_message")


def _asks(part: ContentPart) -> bool:
    """A part that asks something: an image, or text that is not blank."""
    return part.type not in ("text", "input_text") or bool((part.text or "").strip())


def check_conversation_size(messages: list[ChatMessage], settings: GatewaySettings) -> None:
    """Turns and characters, counted before any image is read: the inference worker tokenizes only
    what passed (a 1,000 x 8,000-character conversation took it ~8 s, and others waited)."""
    if len(messages) > settings.max_turns:
        raise APIError(
            413,
            f"messages: {len(messages)} messages exceed the limit of {settings.max_turns}",
            param="messages",
            code="conversation_too_large",
        )
    chars = sum(len(part.text or "") for message in messages for part in parts(message))
    if chars > settings.max_conversation_chars:
        raise APIError(
            413,
            f"messages: {chars} characters of text exceed the limit of {settings.max_conversation_chars}",
            param="messages",
            code="conversation_too_large",
        )


async def _openai_turns(
    messages: list[ChatMessage], settings: GatewaySettings
) -> tuple[list[ChatTurn], list[CheckedImage]]:
    """Messages -> ChatTurns, each naming the images it shows (its image parts, in order, before its
    text); and the distinct images, each read and checked once."""
    urls, fields, turn_parts = _image_parts(messages)
    checked = await read_images(urls, settings, fields)  # the limit counts every image part
    digest_of = {url: image.info.digest for url, image in zip(urls, checked, strict=True)}
    turns: list[ChatTurn] = []
    for message, shown in zip(messages, turn_parts, strict=True):
        text, image_at = _text_and_image_offsets(message)
        role = "system" if message.role == "developer" else message.role
        digests = [digest_of[url] for url in shown]
        turns.append(ChatTurn(role=role, text=text, image=bool(digests), images=digests, image_at=image_at))
        _check_turn(turns[-1], settings)
    if turns[-1].role != "user":
        raise APIError(400, "messages: the last message must be from the user", param="messages")
    return turns, distinct(checked)


def _text_and_image_offsets(message: ChatMessage) -> tuple[str, list[int]]:
    """The message's text parts joined by newlines, and the offset in that text each image part
    comes before (so text and images stay interleaved as sent)."""
    texts: list[str] = []
    image_at: list[int] = []
    for part in parts(message):
        if part.type in ("text", "input_text"):
            texts.append(part.text or "")
        else:
            image_at.append(len("\n".join(texts)))
    return "\n".join(texts), image_at


def _image_parts(messages: list[ChatMessage]) -> tuple[list[str], list[str], list[list[str]]]:
    """(every image part's URL, its location, each message's URLs): checked before any is read."""
    urls: list[str] = []
    fields: list[str] = []
    per_message: list[list[str]] = []
    for i, message in enumerate(messages):
        shown = []
        for j, part in enumerate(parts(message)):
            if part.type in ("text", "input_text"):
                continue
            where = f"messages[{i}].content[{j}]"
            if message.role != "user":
                raise APIError(400, f"{where}: images are only accepted in user messages", param=where)
            url = image_url(part)
            if not url:
                raise APIError(400, f"{where}: image_url.url is required", param=where)
            urls.append(url)
            fields.append(where)
            shown.append(url)
        per_message.append(shown)
    return urls, fields, per_message


def _check_turn(turn: ChatTurn, settings: GatewaySettings) -> None:
    if len(turn.text) > settings.max_prompt_chars:
        raise APIError(
            422,
            f"messages: a message is longer than {settings.max_prompt_chars} characters",
            param="messages",
        )
