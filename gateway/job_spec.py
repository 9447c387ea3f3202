"""``Submission`` -> ``PreparedJob``: the one place a ``JobSpec`` is built.

A ``NextTurn`` continues (or starts) a stored conversation: the job's messages are the stored
turns plus the new question, about the conversation's image unless a new one is sent (a new
image starts the conversation over). A ``WholeConversation`` (OpenAI) is taken as sent. Nothing
is written here (``gateway.accept`` does that).
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
from shared.schemas import ChatTurn, JobSpec, SamplingSpec


@dataclass
class PreparedJob:
    """A validated job, nothing written yet."""

    spec: JobSpec
    image: CheckedImage | None = None  # a new upload to store (None: the conversation's image)
    conversation_fields: dict[str, str] | None = None  # start (or restart) the conversation with these
    touch_conversation: bool = False  # refresh the TTL of an existing conversation


def new_id() -> str:
    return uuid.uuid4().hex


def sampling_spec(options: GenerationOptions, default_max_tokens: int) -> SamplingSpec:
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
    )


async def build_job(state: GatewayState, sub: Submission) -> PreparedJob:
    now = time.time()
    max_job_s = state.settings.max_job_s  # every job ends, whatever the client asked
    spec = JobSpec(
        job_id=new_id(),
        created_at=now,
        deadline=now + min(sub.timeout_s or max_job_s, max_job_s),
        messages=[],
        sampling=sampling_spec(sub.options, state.settings.default_max_tokens),
        use_cache=sub.use_cache,
        cancel_on_disconnect=sub.cancel_on_disconnect,
        source=sub.source,
        tenant=sub.tenant.name if sub.tenant else None,
        priority=priority(sub),
    )
    if isinstance(sub.ask, WholeConversation):
        return _whole_conversation(spec, sub.ask, sub.image)
    conversation = None
    if sub.ask.conversation_id:
        conversation = await load_conversation(state.redis, state.keys, sub.ask.conversation_id, spec.tenant)
    spec.conversation_id = sub.ask.conversation_id or new_id()
    spec.affinity_key = affinity_key(spec.tenant, spec.conversation_id)
    if sub.image is None:
        return await _about_conversation_image(state, spec, sub.ask, conversation)
    return _with_new_image(spec, sub.ask, conversation, sub.image)


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


async def _about_conversation_image(
    state: GatewayState, spec: JobSpec, ask: NextTurn, conversation: Conversation | None
) -> PreparedJob:
    """No upload: ask about the conversation's image, after its turns."""
    if conversation is None or not conversation.image_digest:
        hint = "session not found or expired" if ask.conversation_id else "no session_id given"
        raise APIError(
            400,
            f"image: required ({hint}); attach an image, or name a session that has one",
            param="image",
            code="image_required",
        )
    _check_system(ask, conversation)
    if not await state.redis.exists(state.keys.image(conversation.image_digest)):
        raise APIError(
            400, "image: the session's image has expired; send it again", param="image", code="image_expired"
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
    system = [ChatTurn(role="system", text=ask.system)] if ask.system else []
    spec.messages = [*system, ChatTurn(role="user", text=ask.prompt, image=True)]
    fields = new_conversation_fields(image.info.digest, image.info.format, ask.system)
    return PreparedJob(spec=spec, image=image, conversation_fields=fields)


def _question(ask: NextTurn, conversation: Conversation) -> ChatTurn:
    """The new user turn; it carries the image when no earlier turn does."""
    return ChatTurn(role="user", text=ask.prompt, image=not any(t.image for t in conversation.messages))


def _check_system(ask: NextTurn, conversation: Conversation) -> None:
    if ask.system is not None and ask.system != conversation.system:
        raise APIError(
            400,
            "system: a session's system prompt is fixed when it starts; start a new session to change it",
            param="system",
        )
