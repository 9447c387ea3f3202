"""redis-py's reply parsers side by side: client CPU per call, pure Python against hiredis.

    python -m bench.redis_parser_bench [--smoke] [--out DIR]

The calls our processes make most (a two-command pipeline, a job hash, a token stream read, a
MULTI with the pixels, an 85 KB GET), each timed with ``time.process_time`` over a few thousand
calls, both parsers interleaved in one run against a fresh local Redis (``parser_class``), so the
ratio is measured side by side. Writes bench/results/redis_parser_bench.{json,md}.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis
from redis._parsers import _HiredisParser, _RESP2Parser

from bench.common import ROOT
from bench.report_files import write_report
from scripts.redis_launcher import start_redis

PARSERS: dict[str, Any] = {"python": _RESP2Parser, "hiredis": _HiredisParser}
PIXELS = os.urandom(85_000)  # the bundled model's resized picture is 84,672 bytes


def seed(client: redis.Redis) -> None:
    client.hset("job", mapping={f"field{i}": "x" * 40 for i in range(30)})  # a job hash's size
    for i in range(20):
        client.xadd("tokens", {"type": "token", "text": "abc", "index": str(i)})
    client.set("pixels", PIXELS)


def calls(client: redis.Redis) -> dict[str, Callable[[], object]]:
    def pipeline() -> object:
        pipe = client.pipeline(transaction=False)
        pipe.hgetall("job")
        pipe.exists("cancel")
        return pipe.execute()

    def multi() -> object:
        pipe = client.pipeline(transaction=True)
        pipe.hset("job", "decode_s", "0.001")
        pipe.set("pixels2", PIXELS, ex=60)
        return pipe.execute()

    return {
        "PING": client.ping,
        "pipeline HGETALL + EXISTS": pipeline,
        "HGETALL (30 fields)": lambda: client.hgetall("job"),
        "XRANGE (20 entries)": lambda: client.xrange("tokens"),
        "MULTI HSET + SET 85 KB": multi,
        "GET 85 KB": lambda: client.get("pixels"),
    }


def cpu_us(call: Callable[[], object], count: int) -> float:
    for _ in range(max(1, count // 10)):  # warm
        call()
    start = time.process_time()
    for _ in range(count):
        call()
    return (time.process_time() - start) / count * 1e6


def run(count: int, rounds: int) -> dict[str, Any]:
    server = start_redis()
    try:
        clients = {name: redis.Redis.from_url(server.url, parser_class=cls) for name, cls in PARSERS.items()}
        seed(clients["python"])
        best: dict[str, dict[str, float]] = {}
        for _ in range(rounds):  # interleaved: each round times every call with each parser
            for name, client in clients.items():
                for call_name, call in calls(client).items():
                    us = cpu_us(call, count)
                    row = best.setdefault(call_name, {})
                    row[name] = min(us, row.get(name, us))
        return {"calls": count, "rounds": rounds, "cpu_us": best}
    finally:
        server.stop()


def markdown(result: dict[str, Any]) -> str:
    lines = [
        f"# redis-py reply parsers ({result['when']})",
        "",
        f"Client CPU per call (us, best of {result['rounds']} rounds of {result['calls']} calls).",
        "",
        "| call | pure Python | hiredis | ratio |",
        "|---|---|---|---|",
    ]
    for name, row in result["cpu_us"].items():
        lines.append(
            f"| {name} | {row['python']:.0f} | {row['hiredis']:.0f} | {row['hiredis'] / row['python']:.2f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--smoke", action="store_true", help="a few calls (make test)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args(argv)
    mode = "smoke" if args.smoke else "full"
    result = run(20, 1) if args.smoke else run(3000, 3)
    result |= {"mode": mode, "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    write_report(args.out, "redis_parser_bench", mode, result, markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
