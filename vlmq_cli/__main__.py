"""``vlmq`` (console script) and ``python -m vlmq_cli``: parse the command line, run one command."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence

from vlmq_cli.ask import run_ask
from vlmq_cli.bench import run_bench
from vlmq_cli.client import DEFAULT_URL, Client, CliError
from vlmq_cli.ops import run_dead_letters, run_jobs, run_status

Commands = argparse._SubParsersAction  # what add_subparsers returns


def connection_options(parser: argparse.ArgumentParser, defaults: bool) -> argparse.ArgumentParser:
    """--url, --key, --timeout: before the command (with defaults) or after it (overriding)."""

    def default(value: object) -> object:
        return value if defaults else argparse.SUPPRESS

    url = os.environ.get("VLMQ_URL", DEFAULT_URL)
    parser.add_argument("--url", default=default(url), help=f"base URL (VLMQ_URL; now {url})")
    parser.add_argument(
        "--key", default=default(os.environ.get("VLMQ_API_KEY")), help="API key (VLMQ_API_KEY)"
    )
    parser.add_argument("--timeout", type=float, default=default(60.0), help="seconds per request (60)")
    return parser


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="vlmq", description="Command line client of a vlmq service.")
    connection_options(top, defaults=True)
    common = connection_options(argparse.ArgumentParser(add_help=False), defaults=False)
    commands = top.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_ask(commands, common)
    add_jobs(commands, common)
    status = commands.add_parser(
        "status", parents=[common], help="queues, workers, cache hit ratios, recent latency"
    )
    status.add_argument("--json", action="store_true", help="the server's JSON")
    add_dead_letters(commands, common)
    add_bench(commands, common)
    return top


def add_ask(commands: Commands, common: argparse.ArgumentParser) -> None:
    ask = commands.add_parser(
        "ask",
        parents=[common],
        help="ask about an image; the answer streams to stdout",
        usage="vlmq ask [options] [IMAGE] QUESTION",
    )
    ask.add_argument(
        "words",
        nargs="+",
        metavar="[IMAGE] QUESTION",
        help="image file and question; the question alone asks without an image (text only)",
    )
    ask.add_argument("--session", help="continue this session (a follow-up: no image needed)")
    ask.add_argument(
        "--json", action="store_true", help="one JSON object at the end instead of streaming text"
    )
    ask.add_argument("--max-tokens", type=int, default=64)
    ask.add_argument("--min-tokens", type=int, default=0, help="no end of answer before this many tokens")
    ask.add_argument("--ignore-eos", action="store_true", help="generate past the end of the answer")
    ask.add_argument("--temperature", type=float, default=0.0)
    ask.add_argument("--system", help="system prompt (a new session only)")
    ask.add_argument("--no-cache", action="store_true", help="bypass the result cache")


def add_jobs(commands: Commands, common: argparse.ArgumentParser) -> None:
    jobs = commands.add_parser("jobs", parents=[common], help="a job's state, or cancel it")
    jobs.add_argument("action", choices=["show", "cancel"])
    jobs.add_argument("id", help="the job id")
    jobs.add_argument("--json", action="store_true")


def add_dead_letters(commands: Commands, common: argparse.ArgumentParser) -> None:
    letters = commands.add_parser("dead-letters", parents=[common], help="jobs failed for good (admin key)")
    letters.add_argument("action", choices=["list", "retry"])
    letters.add_argument("id", nargs="?", help="the failed job's id (retry)")
    letters.add_argument("--limit", type=int, default=50)
    letters.add_argument("--json", action="store_true")


def add_bench(commands: Commands, common: argparse.ArgumentParser) -> None:
    bench = commands.add_parser(
        "bench", parents=[common], help="load the service; progress bar, then a results table"
    )
    bench.add_argument("--jobs", type=int, default=64, help="jobs in all (default 64)")
    bench.add_argument("--concurrency", type=int, default=8, help="clients at once (default 8)")
    bench.add_argument("--max-tokens", type=int, default=16)
    bench.add_argument("--ignore-eos", action="store_true", help="every job runs to --max-tokens")
    bench.add_argument("--image", help="one image for every job (default: the server's examples)")
    bench.add_argument("--question", help="one question for every job")
    bench.add_argument("--json", action="store_true", help="the results as JSON")
    bench.add_argument("--samples", action="store_true", help="with --json: every job's figures too")
    bench.add_argument("--quiet", action="store_true", help="no progress bar")


def split_ask(args: argparse.Namespace) -> None:
    if len(args.words) > 2:
        raise CliError('ask takes an image and one question: quote the question ("What colour is it?")', 2)
    args.image = args.words[0] if len(args.words) == 2 else None
    args.question = args.words[-1]


def dispatch(args: argparse.Namespace) -> int:
    if args.command == "bench":
        return run_bench(args)
    if args.command == "ask":
        split_ask(args)
    if args.command == "dead-letters" and args.action == "retry" and not args.id:
        raise CliError("dead-letters retry needs the failed job's id", 2)
    runners: dict[str, Callable[[Client, argparse.Namespace], int]] = {
        "ask": run_ask,
        "jobs": run_jobs,
        "status": run_status,
        "dead-letters": run_dead_letters,
    }
    with Client(args.url, args.key, args.timeout) as client:
        return runners[args.command](client, args)


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return dispatch(args)
    except CliError as exc:
        print(f"vlmq: {exc}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
