"""What each turn of a conversation costs: ``make bench-turns``
(``python -m bench.turns_bench [--smoke] [--conversations N] [--turns T] [--concurrency C] [--out DIR]``).

The stack (no peer) on its own Redis. N conversations over ``/v1/chat/ws``: the first turn shows a
new picture, the next ``T - 1`` turns ask text-only questions in the same session. Turns are sent in
phases (every conversation's turn 1, then every turn 2, ...; C conversations at a time), so each
phase's CPU per process kind is that turn's cost. Per turn: e2e and the done event's stage times
(medians) and CPU-ms a turn by process. A text-only follow-up still shows the conversation's
picture to the model; whether the pipeline decodes it again for every turn shows in the
``decode`` stage and the decode workers' CPU. A last phase sends each conversation's picture again,
with its first question, in a new conversation.

Two stacks, one after the other, on the same workload: the default (a follow-up goes straight to
the worker holding its images) and ``VLMQ_REUSE_DECODED_IMAGES=false`` (every turn decodes
every picture of its conversation); the report puts their follow-up turns side by side.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from websockets.asyncio.client import ClientConnection, connect

from bench.report_files import write_report
from bench.resources import STACK
from bench.service_bench import stack_env
from bench.service_workload import BenchRequest, make_requests
from bench.stack_runs import add_stack_options, on_stack, report_fields, stack_meter
from tests.support.stack import ServiceStack

FOLLOW_UPS = ("What else is in the picture?", "How many shapes are there?", "What colour is the largest one?")
STAGES = ("queue", "decode", "wait", "vision", "prefill", "generation")
MAX_TOKENS = 16
SEED = 4242
AGAIN = -1  # the phase that sends each conversation's picture again, in a new conversation
VARIANTS = {  # name -> the stack's extra settings
    "skip decoding": {},
    "decode every turn": {"VLMQ_REUSE_DECODED_IMAGES": "false"},
}


async def turn(ws: ClientConnection, message: dict[str, Any]) -> dict[str, Any]:
    """One job over an open connection: its e2e seconds, session id, timings and text."""
    started = time.perf_counter()
    await ws.send(json.dumps({**message, "max_tokens": MAX_TOKENS, "no_cache": True}))
    session, text = None, []
    while True:
        event = json.loads(await asyncio.wait_for(ws.recv(), 120))
        if event["type"] == "accepted":
            session = event.get("session_id")
        elif event["type"] == "token":
            text.append(event.get("text") or "")
        elif event["type"] == "done":
            e2e, timings = time.perf_counter() - started, event.get("timings") or {}
            return {"e2e": e2e, "session": session, "timings": timings, "text": "".join(text)}
        elif event["type"] == "error" or event.get("status") in ("failed", "cancelled", "expired"):
            raise RuntimeError(f"turn failed: {event}")


def message(index: int, picture: BenchRequest, session: str | None) -> dict[str, Any]:
    """Turn ``index`` (0: the picture; AGAIN: the same picture in a new conversation)."""
    if index in (0, AGAIN):
        return {"prompt": picture.question, "image": picture.data_url}
    return {"prompt": FOLLOW_UPS[(index - 1) % len(FOLLOW_UPS)], "session_id": session}


async def phase(
    stack: ServiceStack, index: int, pictures: list[BenchRequest], sessions: list[str | None], clients: int
) -> list[dict[str, Any]]:
    """Turn ``index`` of every conversation, ``clients`` at a time (one connection each)."""
    todo = list(range(len(pictures)))
    out: list[dict[str, Any]] = [{} for _ in pictures]

    async def client() -> None:
        async with connect(f"{stack.ws_url}/v1/chat/ws", max_size=None) as ws:
            while todo:
                i = todo.pop(0)
                out[i] = await turn(ws, message(index, pictures[i], sessions[i]))
                sessions[i] = sessions[i] or out[i]["session"]

    await asyncio.gather(*(client() for _ in range(clients)))
    return out


def summary(number: int, kind: str, rows: list[dict[str, Any]], cpu: dict[str, float]) -> dict[str, Any]:
    def ms(values: list[float]) -> float:
        return round(1000 * statistics.median(values), 2)

    return {
        "turn": number,
        "kind": kind,
        "e2e_ms": ms([r["e2e"] for r in rows]),
        "stages_ms": {s: ms([r["timings"].get(s, 0.0) for r in rows]) for s in STAGES},
        "cpu_ms": cpu,
        "answered": sum(bool(r["text"].strip()) for r in rows),
    }


async def measure(args: argparse.Namespace, stack: ServiceStack) -> list[dict[str, Any]]:
    meter = stack_meter(stack)
    warm = make_requests(1, SEED - 1)
    sessions: list[str | None] = [None]
    for index in range(args.turns):  # warm-up: one conversation, every turn
        await phase(stack, index, warm, sessions, 1)
    pictures = make_requests(args.conversations, SEED)
    sessions = [None] * len(pictures)
    rows: list[dict[str, Any]] = []
    for index in [*range(args.turns), AGAIN]:
        before = await asyncio.to_thread(meter.read)
        fresh: list[str | None] = [None] * len(pictures)
        own = sessions if index != AGAIN else fresh  # AGAIN: new conversations
        results = await phase(stack, index, pictures, own, args.concurrency)
        after = await asyncio.to_thread(meter.read)
        n = len(results)
        cpu = {k: round(1000 * (after.cpu_s[k] - before.cpu_s.get(k, 0.0)) / n, 2) for k in after.cpu_s}
        kind = {0: "picture", AGAIN: "picture sent again"}.get(index, "text follow-up")
        rows.append(summary(len(rows) + 1, kind, results, cpu))
        print(json.dumps(rows[-1]), flush=True)
    return rows


def follow_ups(rows: list[dict[str, Any]]) -> dict[str, float]:
    """The follow-up turns' e2e (median of the turns' medians) and CPU-ms a turn, all processes."""
    later = [row for row in rows if row["kind"] == "text follow-up"]
    cpu = [sum(row["cpu_ms"].get(k, 0.0) for k in STACK) for row in later]
    return {"e2e_ms": statistics.median(r["e2e_ms"] for r in later), "cpu_ms": statistics.median(cpu)}


def _row(rows: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    return next(row for row in rows if row["kind"] == kind)


def markdown(result: dict[str, Any]) -> str:
    lines = [
        f"# What each turn costs ({result['when']}, {result['conversations']} conversations at "
        f"{result['concurrency']} concurrent, over /v1/chat/ws)",
        "",
        "| stack | turn | e2e | "
        + " | ".join(STAGES)
        + " | CPU gateway | decode | inference | redis | answered |",
        "|---|---|---|" + "---|" * len(STAGES) + "---|---|---|---|---|",
    ]
    for variant, rows in result["runs"].items():
        for row in rows:
            stages = " | ".join(f"{row['stages_ms'][s]:.1f}" for s in STAGES)
            cpu = " | ".join(f"{row['cpu_ms'].get(k, 0.0):.2f}" for k in STACK)
            lines.append(
                f"| {variant} | {row['turn']} ({row['kind']}) | {row['e2e_ms']:.1f} | {stages} | {cpu} | "
                f"{row['answered']}/{result['conversations']} |"
            )
    on, off = (result["follow_ups"][v] for v in VARIANTS)
    lines += [
        "",
        "Medians in ms (the done event's stage times); CPU-milliseconds a turn by process kind.",
        f"Follow-up turns, skipping decoding vs decoding every turn: e2e {on['e2e_ms']:.1f} vs "
        f"{off['e2e_ms']:.1f} ms ({on['e2e_ms'] / off['e2e_ms']:.2f}x), CPU {on['cpu_ms']:.2f} vs "
        f"{off['cpu_ms']:.2f} ms a turn ({on['cpu_ms'] / off['cpu_ms']:.2f}x).",
    ]
    again_on, again_off = (_row(result["runs"][v], "picture sent again") for v in VARIANTS)
    lines.append(
        f"A picture sent again in a new conversation: e2e {again_on['e2e_ms']:.1f} vs "
        f"{again_off['e2e_ms']:.1f} ms ({again_on['e2e_ms'] / again_off['e2e_ms']:.2f}x)."
    )
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="seconds: 2 conversations, 2 turns")
    parser.add_argument("--conversations", type=int, default=40)
    parser.add_argument("--turns", type=int, default=3, help="the picture's turn, then text follow-ups")
    parser.add_argument("--concurrency", type=int, default=1)
    add_stack_options(parser)
    args = parser.parse_args(argv)
    if args.smoke:
        args.conversations, args.turns, args.concurrency = 2, 2, 1
    if args.turns < 2 or args.conversations < 1 or args.concurrency < 1:
        parser.error("--turns must be at least 2, --conversations and --concurrency at least 1")
    args.mode = "smoke" if args.smoke else "full"
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logs = Path(tempfile.mkdtemp(prefix="vlmq-turns-"))
    runs = {}
    for number, (variant, extra) in enumerate(VARIANTS.items()):
        print(f"# {variant}", flush=True)
        variant_logs = logs / str(number)
        variant_logs.mkdir()
        env = {**stack_env(args), **extra}
        runs[variant] = on_stack(env, variant_logs, lambda stack: measure(args, stack))
    result = {
        **report_fields(args, logs),
        "conversations": args.conversations,
        "turns": args.turns,
        "concurrency": args.concurrency,
        "runs": runs,
        "follow_ups": {variant: follow_ups(rows) for variant, rows in runs.items()},
    }
    write_report(args.out, "turns_bench", args.mode, result, markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
