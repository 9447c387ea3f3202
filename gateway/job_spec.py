"""``Submission`` -> ``PreparedJob``: the one place a ``JobSpec`` is built.

A ``NextTurn`` continues (or starts) a stored conversation: the job's messages are the stored
turns plus the new question, about the conversation's image unless a new one is sent (a new
image starts the conversation over). A conversation may have no image at all (text only). A
``WholeConversation`` (OpenAI) is taken as sent. Nothing is written here (``gateway.accept``
does that).
"""

from __future__ import annotations

import random
import time
import uuid
from dataclasses import dataclass

from gateway.conversations import Conversation, load_conversation, new_conversation_fields
from gateway.errors import APIError
from gateway.image_checks import CheckedImage
from gateway.intake import NextTurn, Submission, WholeConversation
from gateway.keyring import Priority
from gateway.request_params import GenerationOptions
from gateway.state import GatewayState
from shared import tracing
from shared.schemas import ChatTurn, JobSpec, ResponseFormat, SamplingSpec


@dataclass
class PreparedJob:
    """A validated job, nothing written yet."""

    spec: JobSpec
    image: CheckedImage | None = None  # a new upload to store (None: the conversation's image)
    conversation_fields: dict[str, str] | None = None  # start (or restart) the conversation with these
    touch_conversation: bool = False  # refresh the TTL of an existing conversation


def new_id() -> str:
    return uuid.uuid4().hex


def sampling_spec(
    options: GenerationOptions, default_max_tokens: int, response_format: ResponseFormat | None = None
) -> SamplingSpec:
    seed = options.seed
    if options.temperature > 0 and seed is None:
        # Assigned once at submission: a retried attempt regenerates the same tokens.
        seed = random.randrange(2**31)
    return SamplingSpec(
        max_tokens=options.max_tokens or default_max_tokens,
        temperature=options.temperature,
        top_p=options.top_p,
        top_k=options.top_k,
        seed=seed,
        stop=options.stop,
        min_tokens=options.min_tokens,
        ignore_eos=options.ignore_eos,
        response_format=response_format,
    )


async def build_job(state: GatewayState, sub: Submission) -> PreparedJob:
    now = time.time()
    max_job_s = state.settings.max_job_s  # every job ends, whatever the client asked
    spec = JobSpec(
        job_id=new_id(),
        created_at=now,
        deadline=now + min(sub.timeout_s or max_job_s, max_job_s),
        messages=[],
        sampling=sampling_spec(sub.options, state.settings.default_max_tokens, sub.response_format),
        use_cache=sub.use_cache,
        cancel_on_disconnect=sub.cancel_on_disconnect,
        source=sub.source,
        tenant=sub.tenant.name if sub.tenant else None,
        priority=priority(sub),
        traceparent=tracing.current_traceparent(),  # the submit span: the workers' spans join it
    )
    if isinstance(sub.ask, WholeConversation):
        return _whole_conversation(spec, sub.ask, sub.image)
    conversation = None
    if sub.ask.conversation_id:
        conversation = await load_conversation(state.redis, state.keys, sub.ask.conversation_id, spec.tenant)
    spec.conversation_id = sub.ask.conversation_id or new_id()
    spec.affinity_key = affinity_key(spec.tenant, spec.conversation_id)
    if sub.image is not None:
        return _with_new_image(spec, sub.ask, conversation, sub.image)
    if conversation is None:
        return _new_conversation(spec, sub.ask, None)
    return await _continue_conversation(state, spec, sub.ask, conversation)


def priority(sub: Submission) -> Priority:
    """What the request asks for, within what its key allows (a batch key's work is batch)."""
    allowed = sub.tenant.priority if sub.tenant else "interactive"
    if sub.priority == "interactive" and allowed == "batch":
        raise APIError(403, "this API key's requests run at batch priority", param="priority")
    return sub.priority or allowed


def affinity_key(tenant: str | None, key: str | None) -> str | None:
    """The engine's session-KV key: a tenant's ids are its own (never another tenant's KV)."""
    if key is None or tenant is None:
        return key
    return f"{tenant}/{key}"


def _whole_conversation(spec: JobSpec, ask: WholeConversation, image: CheckedImage | None) -> PreparedJob:
    spec.messages, spec.affinity_key = ask.turns, affinity_key(spec.tenant, ask.affinity_key)
    if image is not None:
        spec.image_digest, spec.image_format = image.info.digest, image.info.format
    return PreparedJob(spec=spec, image=image)


async def _continue_conversation(
    state: GatewayState, spec: JobSpec, ask: NextTurn, conversation: Conversation
) -> PreparedJob:
    """No upload: the next question in the conversation, about its image if it has one."""
    _check_system(ask, conversation)
    if conversation.image_digest:
        if not await state.redis.exists(state.keys.image(conversation.image_digest)):
            raise APIError(
                400,
                "image: the session's image has expired; send it again",
                param="image",
                code="image_expired",
            )
        spec.image_digest, spec.image_format = conversation.image_digest, conversation.image_format
    spec.messages = [*conversation.messages, _question(ask, conversation)]
    return PreparedJob(spec=spec, touch_conversation=True)


def _with_new_image(
    spec: JobSpec, ask: NextTurn, conversation: Conversation | None, image: CheckedImage
) -> PreparedJob:
    spec.image_digest, spec.image_format = image.info.digest, image.info.format
    if conversation is not None and conversation.image_digest == image.info.digest:
        # Same image again in its conversation: carry on with it.
        _check_system(ask, conversation)
        spec.messages = [*conversation.messages, _question(ask, conversation)]
        return PreparedJob(spec=spec, image=image, touch_conversation=True)
    # A new conversation, or a new image in one: the conversation starts over about it.
    return _new_conversation(spec, ask, image)


def _new_conversation(spec: JobSpec, ask: NextTurn, image: CheckedImage | None) -> PreparedJob:
    """The first question of a conversation: about ``image``, or text only."""
    if image is None and ask.conversation_id:
        raise APIError(
            404,
            f"session {ask.conversation_id!r} not found or expired; omit session_id to start a new "
            "conversation (with an image or without)",
            param="session_id",
            code="session_not_found",
        )
    system = [ChatTurn(role="system", text=ask.system)] if ask.system else []
    spec.messages = [*system, ChatTurn(role="user", text=ask.prompt, image=image is not None)]
    digest, image_format = (image.info.digest, image.info.format) if image else (None, None)
    fields = new_conversation_fields(digest, image_format, ask.system)
    return PreparedJob(spec=spec, image=image, conversation_fields=fields)


def _question(ask: NextTurn, conversation: Conversation) -> ChatTurn:
    """The new user turn; it carries the conversation's image when no earlier turn does."""
    carries = bool(conversation.image_digest) and not any(t.image for t in conversation.messages)
    return ChatTurn(role="user", text=ask.prompt, image=carries)


def _check_system(ask: NextTurn, conversation: Conversation) -> None:
    if ask.system is not None and ask.system != conversation.system:
        raise APIError(
            400,
            "system: a session's system prompt is fixed when it starts; start a new session to change it",
            param="system",
        )
