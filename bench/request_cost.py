"""What one request costs, by kind of request: ``make bench-request-cost``
(``python -m bench.request_cost [--smoke] [--requests N] [--concurrency C] [--out DIR]``).

The stack (no peer) on its own Redis; for each kind, N requests at C concurrent through the OpenAI
route: CPU-ms a request per process kind (gateway, decode workers, inference worker, Redis, this
load generator) and Redis commands a request (``INFO commandstats`` before and after, the most
called first). The kinds go from a request refused after parsing to a streamed 1024 px JPEG, so a
row minus the row above is what that step of the pipeline costs (bench/README.md has a table); the
last streams 128 tokens a request (``ignore_eos``): what the tokens cost (``--env
VLMQ_STREAM_INTERVAL_MS=0`` against the default: each engine step written on its own, or held).
The figures include the workers' background work (heartbeats, sweeps) over the run's seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from PIL import Image

from bench.report_files import write_report
from bench.resources import STACK, Meter, cost
from bench.service_bench import stack_env
from bench.stack_runs import add_stack_options, on_stack, report_fields, stack_meter
from tests.support.stack import ServiceStack

NO_CACHE = {"Cache-Control": "no-cache"}
QUESTION = "What colour is the shape?"
TOP_COMMANDS = 12
LONG_ANSWER = 128  # tokens of the last kind: what each token costs the pipeline (the stream interval)
Send = Callable[[httpx.AsyncClient, int], Awaitable[None]]


def jpeg(side: int, seed: int) -> bytes:
    """A smooth random picture (JPEG compresses it like a photo, not like noise)."""
    blocks = np.random.default_rng(seed).integers(0, 255, (max(1, side // 16), max(1, side // 16), 3))
    img = Image.fromarray(blocks.astype(np.uint8)).resize((side, side), Image.Resampling.BILINEAR)
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=90)
    return buf.getvalue()


def png(side: int, seed: int = 0) -> bytes:
    buf = io.BytesIO()
    colour = tuple(int(c) for c in np.random.default_rng(seed).integers(0, 255, 3))
    Image.new("RGB", (side, side), colour).save(buf, "PNG")  # type: ignore[arg-type]
    return buf.getvalue()


def chat_body(model: str, image: bytes | None, stream: bool, max_tokens: int = 16) -> dict[str, Any]:
    """A chat completion; ``max_tokens`` over 16: exactly that many tokens (``ignore_eos``)."""
    content: list[dict[str, Any]] = [{"type": "text", "text": QUESTION}]
    if image is not None:
        url = "data:image/jpeg;base64," + base64.b64encode(image).decode()
        content.insert(0, {"type": "image_url", "image_url": {"url": url}})
    messages = [{"role": "user", "content": content}]
    body = {"model": model, "stream": stream, "max_tokens": max_tokens, "messages": messages}
    return {**body, "ignore_eos": True} if max_tokens > 16 else body


def post(bodies: list[dict[str, Any]], headers: dict[str, str], expect: int) -> Send:
    """Request ``i`` sends ``bodies[i % len(bodies)]`` (built before the timing starts)."""

    async def send(client: httpx.AsyncClient, i: int) -> None:
        body = bodies[i % len(bodies)]
        if body["stream"]:
            async with client.stream("POST", "/v1/chat/completions", json=body, headers=headers) as r:
                async for _ in r.aiter_raw():
                    pass
                status = r.status_code
        else:
            status = (await client.post("/v1/chat/completions", json=body, headers=headers)).status_code
        if status != expect:
            raise RuntimeError(f"expected HTTP {expect}, got {status}")

    return send


def kinds(model: str, count: int) -> list[tuple[str, Send]]:
    """(name, one request) in order of the pipeline steps they add. A kind with a picture sends a
    new one each request (``count`` of them): the same picture again skips the decode hop and the
    vision tower (the workers hold it), so it would measure those caches, not the pipeline."""

    def new_pictures(
        make: Callable[[int], bytes], stream: bool, first_seed: int, max_tokens: int = 16
    ) -> list[dict[str, Any]]:
        return [chat_body(model, make(first_seed + i), stream, max_tokens) for i in range(count)]

    big = [chat_body(model, jpeg(640, 1), False)]
    return [
        ("refused after parsing (unknown model, 640 px JPEG)", post([{**big[0], "model": "nope"}], {}, 404)),
        ("text only", post([chat_body(model, None, False)], NO_CACHE, 200)),
        ("result-cache hit (640 px JPEG)", post(big, {}, 200)),
        ("64 px PNG", post(new_pictures(lambda s: png(64, s), False, 10_000), NO_CACHE, 200)),
        ("320 px JPEG, streamed", post(new_pictures(lambda s: jpeg(320, s), True, 20_000), NO_CACHE, 200)),
        ("1024 px JPEG, streamed", post(new_pictures(lambda s: jpeg(1024, s), True, 30_000), NO_CACHE, 200)),
        (
            f"320 px JPEG, streamed, {LONG_ANSWER} tokens",
            post(new_pictures(lambda s: jpeg(320, s), True, 40_000, LONG_ANSWER), NO_CACHE, 200),
        ),
    ]


def command_counts(client: Any) -> dict[str, int]:
    """Calls so far of each Redis command (``INFO commandstats``)."""
    stats = client.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(entry["calls"]) for name, entry in stats.items()}


async def measure_kind(
    name: str, send: Send, stack: ServiceStack, meter: Meter, requests: int, concurrency: int
) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=stack.base_url, timeout=60) as client:
        await asyncio.gather(*(send(client, requests + i) for i in range(2)))  # warm (fills the result cache)
        # fresh heartbeats: the engine's forward CPU counted up to the reading
        before, commands = await asyncio.to_thread(meter.read, time.time()), command_counts(stack.redis)
        started = time.perf_counter()
        slots = asyncio.Semaphore(concurrency)

        async def one(i: int) -> None:
            async with slots:
                await send(client, i)

        await asyncio.gather(*(one(i) for i in range(requests)))
        wall = time.perf_counter() - started
        after, commands_after = await asyncio.to_thread(meter.read, time.time()), command_counts(stack.redis)
    cpu = {k: round(1000 * (after.cpu_s[k] - before.cpu_s.get(k, 0.0)) / requests, 3) for k in after.cpu_s}
    measured = cost(before, after, requests)
    per_request = {k: (v - commands.get(k, 0)) / requests for k, v in commands_after.items()}
    top = sorted(((v, k) for k, v in per_request.items() if v > 0), reverse=True)
    print(f"{name:52s} {cpu}", flush=True)
    return {
        "kind": name,
        "requests": requests,
        "wall_ms_per_request": round(1000 * wall / requests, 2),
        "cpu_ms": cpu,
        "forward_cpu_ms": round(measured["forward_cpu_ms"], 3),
        "outside_forward_cpu_ms": round(measured["outside_forward_cpu_ms"], 3),
        "redis_commands": round(sum(per_request.values()), 1),
        "decodes": round(per_request.get("getex", 0.0), 2),  # a decode task fetches its picture by GETEX
        "top_commands": {k: round(v, 2) for v, k in top[:TOP_COMMANDS]},
    }


def markdown(result: dict[str, Any]) -> str:
    lines = [
        f"# What one request costs ({result['when']}, {result['requests']} requests a kind at "
        f"{result['concurrency']} concurrent)",
        "",
        "| request | gateway | decode | inference | redis | loadgen | forward | outside forward | decodes"
        " | Redis commands"
        " | most called |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in result["rows"]:
        cpu = row["cpu_ms"]
        top = ", ".join(f"{k} {v:g}" for k, v in list(row["top_commands"].items())[:5])
        cells = [f"{cpu.get(k, 0.0):.2f}" for k in (*STACK, "loadgen")]
        cells += [f"{row['forward_cpu_ms']:.2f}", f"{row['outside_forward_cpu_ms']:.2f}"]
        cells.append(f"{row['decodes']:g}")
        lines.append(f"| {row['kind']} | {' | '.join(cells)} | {row['redis_commands']:g} | {top} |")
    lines += [
        "",
        "CPU-milliseconds a request by process kind; forward: the inference worker's model forward (its"
        " engine counters); outside forward: gateway + decode + inference + Redis - forward; decode tasks"
        " run a request (`GETEX` of a picture's bytes); Redis commands a request (INFO commandstats).",
    ]
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="seconds: a few requests a kind (make test)")
    parser.add_argument("--requests", type=int, default=200, help="requests a kind")
    parser.add_argument("--concurrency", type=int, default=8)
    add_stack_options(parser)
    args = parser.parse_args(argv)
    if args.smoke:
        args.requests, args.concurrency = 4, 2
    args.mode = "smoke" if args.smoke else "full"
    return args


async def measure(args: argparse.Namespace, stack: ServiceStack) -> list[dict[str, Any]]:
    meter = stack_meter(stack)
    model = stack.settings.model_name
    rows = []
    for name, send in kinds(model, args.requests + 2):
        rows.append(await measure_kind(name, send, stack, meter, args.requests, args.concurrency))
    return rows


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logs = Path(tempfile.mkdtemp(prefix="vlmq-request-cost-"))
    rows = on_stack(stack_env(args), logs, lambda stack: measure(args, stack))
    result = {
        **report_fields(args, logs),
        "requests": args.requests,
        "concurrency": args.concurrency,
        "rows": rows,
    }
    write_report(args.out, "request_cost", args.mode, result, markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
