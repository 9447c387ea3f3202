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
from dataclasses import dataclass, field

from pydantic_core import PydanticSerializationError

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
    images: list[CheckedImage] = field(default_factory=list)  # new uploads to store (once per digest)
    conversation_fields: dict[str, str] | None = None  # start the conversation with these
    conversation_updates: dict[str, str] | None = None  # fields of an existing conversation to set
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
    """The job a submission asks for, refused (400) if any of its text cannot be stored."""
    job = await _build_job(state, sub)
    check_storable(job.spec)
    return job


def check_storable(spec: JobSpec) -> None:
    """Refuse text Redis cannot hold as UTF-8: a JSON body may escape a lone UTF-16 surrogate
    (``"\\ud800"``), which Python decodes into a ``str`` that no UTF-8 writer accepts. Caught here,
    before quotas and admission are charged, it is the client's 400, never a 500 with a place held
    in the queue. The spec's own serialisation checks every field (messages, stop strings, schema)."""
    try:
        spec.model_dump_json()
    except PydanticSerializationError as exc:
        if "surrogates not allowed" not in str(exc):
            raise
        raise APIError(
            400,
            "the request's text is not valid Unicode: it holds a lone UTF-16 surrogate (an escape "
            "from \\ud800 to \\udfff without its pair)",
            code="invalid_unicode",
        ) from exc


async def _build_job(state: GatewayState, sub: Submission) -> PreparedJob:
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
        return _whole_conversation(spec, sub.ask, sub.images)
    conversation = None
    if sub.ask.conversation_id:
        conversation = await load_conversation(state.redis, state.keys, sub.ask.conversation_id, spec.tenant)
    spec.conversation_id = sub.ask.conversation_id or new_id()
    spec.affinity_key = affinity_key(spec.tenant, spec.conversation_id)
    if conversation is None:
        return _new_conversation(spec, sub.ask, sub.images)
    job = _continue_conversation(spec, sub.ask, conversation, sub.images)
    _check_image_count(spec, state.settings.max_images_per_request)
    await _check_stored_images(state, spec, sub.images)
    return job


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


def _whole_conversation(spec: JobSpec, ask: WholeConversation, images: list[CheckedImage]) -> PreparedJob:
    spec.messages, spec.affinity_key = ask.turns, affinity_key(spec.tenant, ask.affinity_key)
    if images:
        spec.image_digest, spec.image_format = images[0].info.digest, images[0].info.format
    return PreparedJob(spec=spec, images=images)


def _continue_conversation(
    spec: JobSpec, ask: NextTurn, conversation: Conversation, uploads: list[CheckedImage]
) -> PreparedJob:
    """The next question in the conversation, showing the images it adds (an image the conversation
    already shows is not shown again)."""
    _check_system(ask, conversation)
    legacy = conversation.image_digest
    history = [d for turn in conversation.messages for d in turn.digests(legacy)]
    carried = [] if history else conversation.images  # the first turn's, if not recorded yet
    new = [i.info.digest for i in uploads if i.info.digest not in history and i.info.digest not in carried]
    question = ChatTurn(role="user", text=ask.prompt, image=bool(carried + new), images=carried + new)
    spec.messages = [*conversation.messages, question]
    updates = None
    if legacy:
        spec.image_digest, spec.image_format = legacy, conversation.image_format
    elif uploads:  # a text-only conversation's first image: the conversation's first from now on
        spec.image_digest, spec.image_format = uploads[0].info.digest, uploads[0].info.format
        updates = {"image_digest": spec.image_digest, "image_format": spec.image_format}
    return PreparedJob(spec=spec, images=uploads, conversation_updates=updates, touch_conversation=True)


def _new_conversation(spec: JobSpec, ask: NextTurn, images: list[CheckedImage]) -> PreparedJob:
    """The first question of a conversation: about ``images``, or text only."""
    if not images and ask.conversation_id:
        raise APIError(
            404,
            f"session {ask.conversation_id!r} not found or expired; omit session_id to start a new "
            "conversation (with an image or without)",
            param="session_id",
            code="session_not_found",
        )
    system = [ChatTurn(role="system", text=ask.system)] if ask.system else []
    digests = [i.info.digest for i in images]
    spec.messages = [*system, ChatTurn(role="user", text=ask.prompt, image=bool(digests), images=digests)]
    if images:
        spec.image_digest, spec.image_format = images[0].info.digest, images[0].info.format
    fields = new_conversation_fields(digests, spec.image_format, ask.system)
    return PreparedJob(spec=spec, images=images, conversation_fields=fields)


def _check_image_count(spec: JobSpec, limit: int) -> None:
    shown = sum(len(turn.digests(spec.image_digest)) for turn in spec.messages)
    if shown > limit:
        raise APIError(
            400,
            f"image: this turn would make the conversation show {shown} images, over the limit of "
            f"{limit} per request; start a new session",
            param="image",
            code="too_many_images",
        )


async def _check_stored_images(state: GatewayState, spec: JobSpec, uploads: list[CheckedImage]) -> None:
    """The conversation's earlier images must still be stored (their bytes are decoded again)."""
    sent = {i.info.digest for i in uploads}
    stored = [d for d in spec.image_digests() if d not in sent]
    if not stored:
        return
    async with state.redis.pipeline(transaction=False) as pipe:
        for digest in stored:
            pipe.exists(state.keys.image(digest))
        found = await pipe.execute()
    if not all(found):
        raise APIError(
            400,
            "image: an image of the session has expired; send it again (or start a new session)",
            param="image",
            code="image_expired",
        )


def _check_system(ask: NextTurn, conversation: Conversation) -> None:
    if ask.system is not None and ask.system != conversation.system:
        raise APIError(
            400,
            "system: a session's system prompt is fixed when it starts; start a new session to change it",
            param="system",
        )
