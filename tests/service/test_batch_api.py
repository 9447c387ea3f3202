"""OpenAI's Batch API on the durable queue, through the official ``openai`` client: a batch of 200
chat requests ends with 200 results equal to the same requests sent one by one; a batch goes on
through a SIGKILL of the inference worker; a cancelled batch stops and says what it never ran; a
line the driver cannot start or collect fails alone."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import time
from collections.abc import Callable
from typing import Any

import openai
import pytest

from tests.support import jobs as J
from tests.support.stack import ServiceStack

pytestmark = pytest.mark.slow
PICTURES = [J.image_bytes("PNG", (168, 168), seed=s) for s in range(5)]
QUESTIONS = [
    "What colour is the circle?",
    "How many shapes are there?",
    "What shape is big?",
    "Where is the star?",
]


def request(i: int) -> dict[str, Any]:
    url = "data:image/png;base64," + base64.b64encode(PICTURES[i % len(PICTURES)]).decode()
    content = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": QUESTIONS[i % 4]}]
    body = {"model": "vlmq-tiny", "messages": [{"role": "user", "content": content}], "max_tokens": 6}
    return {"custom_id": f"req-{i}", "method": "POST", "url": "/v1/chat/completions", "body": body}


def upload(client: openai.OpenAI, count: int) -> str:
    return upload_lines(client, [json.dumps(request(i)) for i in range(count)])


def upload_lines(client: openai.OpenAI, lines: list[str]) -> str:
    data = "\n".join(lines).encode()
    return client.files.create(file=("batch.jsonl", io.BytesIO(data)), purpose="batch").id


def wait_for_batch(client: openai.OpenAI, batch_id: str, timeout_s: float = 240) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        batch = client.batches.retrieve(batch_id)
        if batch.status in ("completed", "failed", "expired", "cancelled"):
            return batch
        time.sleep(0.5)
    raise TimeoutError(f"batch {batch_id} still {batch.status}")


def results(client: openai.OpenAI, file_id: str | None) -> dict[str, Any]:
    if file_id is None:
        return {}
    lines = client.files.content(file_id).content.decode().splitlines()
    return {json.loads(line)["custom_id"]: json.loads(line) for line in lines}


def openai_client(stack: ServiceStack) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack.base_url}/v1", api_key="unused", max_retries=0)


async def one_by_one(stack: ServiceStack, count: int) -> dict[str, str]:
    client = openai.AsyncOpenAI(base_url=f"{stack.base_url}/v1", api_key="unused", max_retries=0)
    limit = asyncio.Semaphore(8)

    async def ask(i: int) -> tuple[str, str]:
        async with limit:
            resp = await client.chat.completions.create(
                **request(i)["body"], extra_headers={"Cache-Control": "no-cache"}
            )
        return f"req-{i}", resp.choices[0].message.content or ""

    return dict(await asyncio.gather(*[ask(i) for i in range(count)]))


async def test_a_batch_of_200_matches_the_same_requests_one_by_one(service_stack: ServiceStack) -> None:
    client = openai_client(service_stack)
    batch = client.batches.create(
        input_file_id=upload(client, 200), endpoint="/v1/chat/completions", completion_window="24h"
    )
    assert batch.status == "in_progress" and batch.request_counts and batch.request_counts.total == 200
    batch = wait_for_batch(client, batch.id)
    assert batch.status == "completed" and batch.request_counts.completed == 200, batch
    answers = {
        cid: r["response"]["body"]["choices"][0]["message"]["content"]
        for cid, r in results(client, batch.output_file_id).items()
    }
    assert len(answers) == 200 and batch.error_file_id is None
    assert answers == await one_by_one(service_stack, 200)
    assert batch.id in [b.id for b in client.batches.list(limit=10).data]


def test_a_batch_goes_on_through_a_sigkill_of_the_inference_worker(
    stack_factory: Callable[..., ServiceStack],
) -> None:
    stack = stack_factory(extra_env={"VLMQ_BATCH_INFLIGHT": "8", "VLMQ_CLAIM_IDLE_MS": "2000"})
    client = openai_client(stack)
    batch = client.batches.create(
        input_file_id=upload(client, 40), endpoint="/v1/chat/completions", completion_window="24h"
    )
    deadline = time.monotonic() + 120
    while client.batches.retrieve(batch.id).request_counts.completed < 8:  # type: ignore[union-attr]
        assert time.monotonic() < deadline
        time.sleep(0.2)
    stack.kill("inference")
    stack.restart("inference")
    done = wait_for_batch(client, batch.id)
    assert done.status == "completed" and done.request_counts.completed == 40, done
    assert len(results(client, done.output_file_id)) == 40


def test_a_cancelled_batch_stops_and_lists_what_it_never_ran(
    stack_factory: Callable[..., ServiceStack],
) -> None:
    stack = stack_factory(components=("gateway",), extra_env={"VLMQ_BATCH_INFLIGHT": "2"})  # nothing runs
    client = openai_client(stack)
    batch = client.batches.create(
        input_file_id=upload(client, 10), endpoint="/v1/chat/completions", completion_window="24h"
    )
    time.sleep(2.5)  # the driver starts two
    assert client.batches.cancel(batch.id).status in ("cancelling", "cancelled")
    done = wait_for_batch(client, batch.id, 60)
    assert done.status == "cancelled" and done.output_file_id is not None
    errors = results(client, done.error_file_id)
    assert len(errors) == 10  # two cancelled while queued, eight never started
    assert sum(e["error"]["code"] == "batch_cancelled" for e in errors.values()) == 8


def test_bad_batch_input_is_refused_at_upload(service_stack: ServiceStack) -> None:
    client = openai_client(service_stack)
    bad = b'{"custom_id": "a", "method": "POST", "url": "/v1/embeddings", "body": {}}\n'
    with pytest.raises(openai.BadRequestError, match="only POST /v1/chat/completions"):
        client.files.create(file=("b.jsonl", io.BytesIO(bad)), purpose="batch")
    with pytest.raises(openai.NotFoundError):
        client.batches.retrieve("batch_" + "0" * 32)


def deep_schema_line(i: int, levels: int) -> str:
    """A line whose schema nests ``levels`` deep, as JSON text (deeper than Python's encoder goes)."""
    schema = '{"type":"array","items":' * levels + '{"type":"string"}' + "}" * levels
    line = request(i)
    line["body"]["response_format"] = {"type": "json_schema", "json_schema": {"name": "d", "schema": {}}}
    return json.dumps(line).replace('"schema": {}', f'"schema": {schema}')


def test_a_line_that_cannot_start_fails_alone(service_stack: ServiceStack) -> None:
    """A line whose schema nests 200 deep once made every pass of the driver fail (a RecursionError)
    and the batch stayed in progress for ever; now it is a 400 of its own. A line that trips over
    something unforeseen (here a stored body no upload takes: not an object) fails alone too."""
    client = openai_client(service_stack)
    lines = [json.dumps(request(0)), deep_schema_line(1, 200), json.dumps(request(2)), json.dumps(request(3))]
    file_id = upload_lines(client, lines)
    unforeseen = {**request(2), "body": ["not", "an", "object"]}
    service_stack.redis.lset(service_stack.keys.file_lines(file_id), 2, json.dumps(unforeseen))
    batch = client.batches.create(
        input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    done = wait_for_batch(client, batch.id, 120)
    assert done.status == "completed" and done.request_counts, done
    assert (done.request_counts.completed, done.request_counts.failed) == (2, 2)
    assert set(results(client, done.output_file_id)) == {"req-0", "req-3"}
    errors = {cid: line["error"] for cid, line in results(client, done.error_file_id).items()}
    assert errors["req-1"]["code"] == "invalid_response_format", errors
    assert "nests deeper than 32 levels" in errors["req-1"]["message"]
    assert errors["req-2"]["code"] == "internal" and "internal error" in errors["req-2"]["message"]


def test_a_job_record_that_cannot_be_read_fails_its_line_alone(
    stack_factory: Callable[..., ServiceStack],
) -> None:
    """A started line's job record this release cannot read (here: an unknown status) fails that line;
    the batch still ends (nothing runs the jobs here: it is cancelled)."""
    stack = stack_factory(components=("gateway",), extra_env={"VLMQ_BATCH_INFLIGHT": "2"})
    client = openai_client(stack)
    batch = client.batches.create(
        input_file_id=upload(client, 3), endpoint="/v1/chat/completions", completion_window="24h"
    )
    inflight = stack.keys.batch_inflight(batch.id)
    wait_until(lambda: stack.redis.hlen(inflight) == 2)
    job_id = stack.redis.hget(inflight, "0").decode()
    stack.redis.hset(stack.keys.job(job_id), "status", "no-such-status")
    wait_until(lambda: client.batches.retrieve(batch.id).request_counts.failed == 1)  # type: ignore[union-attr]
    client.batches.cancel(batch.id)
    done = wait_for_batch(client, batch.id, 60)
    assert done.status == "cancelled", done
    errors = {cid: line["error"] for cid, line in results(client, done.error_file_id).items()}
    assert set(errors) == {"req-0", "req-1", "req-2"} and errors["req-0"]["code"] == "internal", errors


def wait_until(check: Callable[[], bool], timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)
