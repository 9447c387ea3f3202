"""Result cache (contract §Result cache): a greedy repeat is answered from Redis at once."""

from __future__ import annotations

import base64
import contextlib
from collections.abc import Callable
from typing import Any

import httpx
import openai
import redis

from shared import metrics_hash, result_cache
from shared.jobs import JobRecord
from shared.schemas import UsageInfo
from tests.gateway.conftest import GATEWAY_ENV
from tests.gateway.workerside import decode_tasks
from tests.support.jobs import image_bytes
from tests.support.stack import ServiceStack

JPEG = image_bytes("JPEG", (100, 80), seed=21)


def seed_cache_from(r: redis.Redis, stack: ServiceStack, job_id: str, text: str) -> None:
    """Write the cached result the way the inference worker does for this job's spec."""
    spec = JobRecord.from_hash(r.hgetall(stack.keys.job(job_id))).spec
    key = result_cache.cache_key(stack.keys, stack.settings.result_model_id, spec)
    assert key is not None
    cached = result_cache.CachedResult(
        text=text, usage=UsageInfo(prompt_tokens=90, completion_tokens=3), finish_reason="stop"
    )
    r.set(key, result_cache.encode(cached), ex=600)


async def post(
    client: httpx.AsyncClient, headers: dict[str, str] | None = None, **fields: Any
) -> httpx.Response:
    body = {
        "image": base64.b64encode(JPEG).decode(),
        "prompt": "Which colour?",
        "session_id": "rc-1",
        **fields,
    }
    return await client.post("/v1/jobs", json=body, headers=headers or {})


async def test_hit_miss_and_bypass(client: httpx.AsyncClient, gateway: ServiceStack, r: redis.Redis) -> None:
    first = await post(client)
    assert first.status_code == 202 and first.json()["status"] == "queued"
    assert first.headers["x-vlmq-result-cache"] == "miss" and first.headers["cache-control"] == "no-store"
    seed_cache_from(r, gateway, first.json()["id"], "Green.")
    r.delete(gateway.keys.conversation("rc-1"))  # same spec again: a fresh session about the same image

    tasks_before = len(decode_tasks(r, gateway.key_prefix))
    done_field = metrics_hash.series("jobs_total", outcome="done")
    done_before = int(r.hget(gateway.keys.metrics_counters(), done_field) or 0)
    hit = await post(client)
    body = hit.json()
    assert hit.status_code == 202 and body["status"] == "done" and body["result_cached"] is True
    assert body["text"] == "Green."
    assert hit.headers["cache-control"] == f"public, max-age={gateway.settings.result_cache_ttl_s}"
    assert len(decode_tasks(r, gateway.key_prefix)) == tasks_before  # nothing enqueued
    assert int(r.hget(gateway.keys.metrics_counters(), done_field) or 0) == done_before + 1  # counted
    view = (await client.get(f"/v1/jobs/{body['id']}")).json()
    assert view["status"] == "done" and view["final_text"] == "Green." and view["result_cached"] is True
    job_key = gateway.keys.job(body["id"])  # admission's place (same round trip as the lookup) given back
    assert r.zscore(gateway.keys.active_jobs(), job_key) is None
    assert r.zscore(gateway.keys.interactive_jobs(), job_key) is None
    turns = (await client.get("/v1/sessions/rc-1")).json()["turns"]
    assert [t["role"] for t in turns] == ["user", "assistant"] and turns[-1]["text"] == "Green."

    bypasses = [{"Cache-Control": "no-cache"}, {"Cache-Control": "max-age=0"}, {"Pragma": "no-cache"}]
    for headers in bypasses:  # each asks for a fresh answer (RFC 9111: Pragma where no Cache-Control)
        r.delete(gateway.keys.conversation("rc-1"))
        bypass = await post(client, headers=headers)
        assert bypass.json()["status"] == "queued" and bypass.headers["x-vlmq-result-cache"] == "bypass"
    r.delete(gateway.keys.conversation("rc-1"))
    kept = await post(client, headers={"Pragma": "no-cache", "Cache-Control": "max-age=60"})
    assert kept.json()["status"] == "done"  # Cache-Control, when sent, decides


async def test_sampling_is_never_cached(
    client: httpx.AsyncClient, gateway: ServiceStack, r: redis.Redis
) -> None:
    first = await post(client, session_id="rc-2", temperature=0.8)
    spec = JobRecord.from_hash(r.hgetall(gateway.keys.job(first.json()["id"]))).spec
    assert result_cache.cache_key(gateway.keys, gateway.settings.result_model_id, spec) is None
    assert (await post(client, session_id="rc-3", temperature=0.8)).json()["status"] == "queued"


async def test_openai_hit(gateway: ServiceStack, r: redis.Redis) -> None:
    data_url = "data:image/jpeg;base64," + base64.b64encode(JPEG).decode()
    messages: Any = [
        {
            "role": "user",
            "content": [
                {"type": "image_url", "image_url": {"url": data_url}},
                {"type": "text", "text": "Which colour?"},
            ],
        }
    ]
    # Seed the cache from the spec the gateway builds for this request (one real submission).
    async with httpx.AsyncClient(base_url=gateway.base_url, timeout=0.5) as client:
        before = set(decode_tasks(r, gateway.key_prefix))
        with contextlib.suppress(httpx.ReadTimeout):
            await client.post(
                "/v1/chat/completions",
                json={"model": gateway.settings.model_name, "messages": messages, "max_tokens": 5},
            )
        (job_id,) = set(decode_tasks(r, gateway.key_prefix)) - before
    seed_cache_from(r, gateway, job_id, "Green.")
    async with openai.AsyncOpenAI(base_url=f"{gateway.base_url}/v1", api_key="x", max_retries=0) as oai:
        raw = await oai.chat.completions.with_raw_response.create(
            model=gateway.settings.model_name, messages=messages, max_tokens=5
        )
        assert raw.headers["cache-control"].startswith("public, max-age=")
        assert raw.parse().choices[0].message.content == "Green."
        stream: Any = await oai.chat.completions.create(
            model=gateway.settings.model_name,
            messages=messages,
            max_tokens=5,
            stream=True,
        )
        assert "".join([c.choices[0].delta.content or "" async for c in stream if c.choices]) == "Green."


def test_key_names_the_exact_weights(tmp_path: Any) -> None:
    """A retrained checkpoint under the same name, or another quantization, never hits old answers."""
    from shared.keys import Keys
    from shared.schemas import SamplingSpec
    from tests.support.jobs import make_spec

    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text('{"hidden_size": 64}')
    (ckpt / "model.safetensors").write_bytes(b"0" * 100)
    spec, keys = make_spec(digest="d" * 64), Keys("t")
    base = result_cache.cache_key(keys, result_cache.model_identity(str(ckpt), "none"), spec)
    assert base != result_cache.cache_key(keys, result_cache.model_identity(str(ckpt), "int8"), spec)
    result_cache.checkpoint_fingerprint.cache_clear()  # a new process after retraining
    (ckpt / "model.safetensors").write_bytes(b"1" * 101)
    assert base != result_cache.cache_key(keys, result_cache.model_identity(str(ckpt), "none"), spec)
    greedy = spec.model_copy(update={"sampling": SamplingSpec(max_tokens=8, top_p=0.5, top_k=3, seed=7)})
    same = result_cache.model_identity(str(ckpt), "none")
    assert result_cache.cache_key(keys, same, greedy) == result_cache.cache_key(keys, same, spec)


async def test_a_hit_is_served_when_the_queues_are_full(stack_factory: Callable[..., ServiceStack]) -> None:
    gw = stack_factory(components=("gateway",), extra_env={**GATEWAY_ENV, "VLMQ_MAX_QUEUE_DEPTH": "1"})
    r = gw.redis
    async with httpx.AsyncClient(base_url=gw.base_url, timeout=20) as client:
        first = await post(client)
        assert first.status_code == 202 and first.json()["status"] == "queued"  # the queue is now full
        seed_cache_from(r, gw, first.json()["id"], "Blue.")
        r.delete(gw.keys.conversation("rc-1"))
        hit = await post(client)
        assert hit.status_code == 202 and hit.json()["text"] == "Blue."
        refused = await post(client, headers={"Cache-Control": "no-cache"}, session_id="rc-2")
        assert refused.status_code == 429 and refused.json()["error"]["code"] == "queue_full"
    assert r.zcard(gw.keys.active_jobs()) == 1  # the first job only
