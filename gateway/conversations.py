"""Gateway side of stored conversations (docs/service-contract.md §Conversations).

The gateway creates a conversation on its first job (image digest, optional system turn) and
refreshes its TTL on later jobs; the inference worker appends each finished turn. The one
exception is a result-cache hit: no worker runs, so the gateway records the turn itself, the
same way the worker does (``shared.conversations.record_turn``, a compare-and-append). Clients
name a conversation ``session_id`` (the API's word for it).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis

from shared.conversations import load_messages, turns_json
from shared.keys import Keys
from shared.schemas import ChatTurn
from shared.values import as_str


@dataclass
class Conversation:
    conversation_id: str
    image_digest: str | None  # its first image (every turn names the images it shows)
    image_format: str | None
    messages: list[ChatTurn] = field(default_factory=list)
    updated_at: float = 0.0
    images: list[str] = field(default_factory=list)  # those its first question showed

    def shown(self) -> list[str]:
        """Every image the conversation shows, each once, in order."""
        seen = dict.fromkeys(d for turn in self.messages for d in turn.digests(self.image_digest))
        return list(seen) or list(self.images)

    @property
    def system(self) -> str | None:
        return next((t.text for t in self.messages if t.role == "system"), None)

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.conversation_id,
            "image_digest": self.image_digest,
            "image_format": self.image_format,
            "images": self.shown(),
            "turns": [t.model_dump() for t in self.messages],
            "updated_at": self.updated_at,
        }


async def load_conversation(
    redis: aioredis.Redis, keys: Keys, conversation_id: str, tenant: str | None
) -> Conversation | None:
    raw = await redis.hgetall(keys.conversation(conversation_id, tenant))
    if not raw:
        return None
    fields = {as_str(k): as_str(v) for k, v in raw.items()}
    return Conversation(
        conversation_id=conversation_id,
        image_digest=fields.get("image_digest") or None,
        image_format=fields.get("image_format") or None,
        messages=parse_turns(fields.get("messages")),
        updated_at=float(fields.get("updated_at") or 0.0),
        images=_first_images(fields),
    )


def _first_images(fields: dict[str, str]) -> list[str]:
    """The images of the first question (a previous release's conversation: its one image)."""
    try:
        images = json.loads(fields.get("images") or "[]")
    except ValueError:
        images = []
    if isinstance(images, list) and images and all(isinstance(d, str) for d in images):
        return images
    return [fields["image_digest"]] if fields.get("image_digest") else []


def parse_turns(raw: str | None) -> list[ChatTurn]:
    try:
        return load_messages(raw)
    except (ValueError, TypeError):  # unreadable history: start over rather than fail the job
        return []


def new_conversation_fields(
    image_digests: list[str], image_format: str | None, system: str | None
) -> dict[str, str]:
    """A new conversation's hash: about the first question's images (``image_format``: the first's),
    or text only."""
    turns = [ChatTurn(role="system", text=system)] if system else []
    return {
        "image_digest": image_digests[0] if image_digests else "",
        "image_format": image_format or "",
        "images": json.dumps(image_digests),
        "messages": turns_json(turns),
        "updated_at": str(time.time()),
    }


async def delete_conversation(
    redis: aioredis.Redis, keys: Keys, conversation_id: str, tenant: str | None
) -> bool:
    return bool(await redis.delete(keys.conversation(conversation_id, tenant)))
