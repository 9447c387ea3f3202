"""The Batch API's lists and files through the official client: pages that follow ``has_more``
and ``after`` in creation order, files listed and deleted, an input file kept while its batch runs.
No worker runs here: the batches stay in progress, which is all these tests need. Their jobs, never
run, stay in the queues: a gateway of this module's own keeps them from the other tests'."""

from __future__ import annotations

import io
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import openai
import pytest

from tests.gateway.conftest import gateway_only
from tests.support.stack import ServiceStack

LINE = {
    "custom_id": "only",
    "method": "POST",
    "url": "/v1/chat/completions",
    "body": {"model": "vlmq-tiny", "messages": [{"role": "user", "content": "What colour?"}]},
}


@pytest.fixture(scope="module")
def gateway(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceStack]:
    """This module's own gateway (its own key prefix), in place of the shared one."""
    yield from gateway_only(redis_url, tmp_path_factory, "batch-gateway")


@pytest.fixture
async def oai(gateway: ServiceStack) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(base_url=f"{gateway.base_url}/v1", api_key="sk-test", max_retries=0) as c:
        yield c


async def upload(oai: openai.AsyncOpenAI) -> str:
    data = io.BytesIO(json.dumps(LINE).encode())
    return (await oai.files.create(file=("in.jsonl", data), purpose="batch")).id


async def test_batch_pages_follow_has_more_and_after_newest_first(oai: openai.AsyncOpenAI) -> None:
    """Five batches made within one second: every page but the last says more follow, and the
    client's auto-pagination walks them all, newest first, each once."""
    made = [(await oai.batches.create(input_file_id=await upload(oai), endpoint="/v1/chat/completions",
                                      completion_window="24h")).id for _ in range(5)]  # fmt: skip
    first = await oai.batches.list(limit=2)
    assert len(first.data) == 2 and first.has_more
    seen = [batch.id async for batch in oai.batches.list(limit=2)]
    assert len(seen) == len(set(seen))
    ours = [batch_id for batch_id in seen if batch_id in made]
    assert ours == made[::-1]


async def test_a_page_after_an_unknown_id_is_a_400(client: httpx.AsyncClient) -> None:
    resp = await client.get("/v1/batches", params={"after": "batch_nope"})
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "after"


async def test_files_are_listed_and_deleted(oai: openai.AsyncOpenAI, client: httpx.AsyncClient) -> None:
    kept, dropped = await upload(oai), await upload(oai)
    listed = [f.id async for f in oai.files.list(purpose="batch")]
    assert listed.index(dropped) < listed.index(kept)  # newest first
    deleted = await oai.files.delete(dropped)
    assert deleted.id == dropped and deleted.deleted
    assert dropped not in [f.id async for f in oai.files.list()]
    with pytest.raises(openai.NotFoundError):
        await oai.files.retrieve(dropped)
    assert (await client.delete(f"/v1/files/{dropped}")).status_code == 404


async def test_a_client_deleting_what_it_pages_through_pages_on(oai: openai.AsyncOpenAI) -> None:
    """The usual clean-up loop: the next page starts after a file just deleted."""
    made = {await upload(oai) for _ in range(3)}
    async for listed in oai.files.list(limit=1):
        if listed.id in made:
            await oai.files.delete(listed.id)
            made.discard(listed.id)
    assert not made


async def test_the_input_of_an_unfinished_batch_is_not_deleted(oai: openai.AsyncOpenAI) -> None:
    input_id = await upload(oai)
    batch = await oai.batches.create(
        input_file_id=input_id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    with pytest.raises(openai.ConflictError) as info:
        await oai.files.delete(input_id)
    body: Any = info.value.body
    assert body["code"] == "file_in_use" and batch.id in body["message"]
    await oai.batches.cancel(batch.id)


async def test_an_input_file_id_that_is_not_a_string_is_a_400(client: httpx.AsyncClient) -> None:
    body = {"input_file_id": ["x"], "endpoint": "/v1/chat/completions", "completion_window": "24h"}
    resp = await client.post("/v1/batches", json=body)
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "input_file_id"
