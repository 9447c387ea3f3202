"""``vlmq ask [IMAGE] QUESTION``: submit a job (``POST /v1/jobs``), print its answer as it streams
(``/v1/jobs/{id}/events``). Ctrl-C cancels the job. Exit 0 when it is done, 1 otherwise."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from vlmq_cli.client import Client, CliError
from vlmq_cli.tables import ms

TERMINAL = {"done", "failed", "cancelled", "expired"}


def is_terminal(event: dict[str, Any]) -> bool:
    return event.get("type") == "done" or event.get("status") in TERMINAL


def job_form(args: argparse.Namespace) -> dict[str, str]:
    form = {"prompt": args.question, "max_tokens": str(args.max_tokens)}
    optional = {
        "session_id": args.session,
        "min_tokens": args.min_tokens or None,
        "ignore_eos": "true" if args.ignore_eos else None,
        "temperature": args.temperature or None,
        "system": args.system,
    }
    form.update({name: str(value) for name, value in optional.items() if value is not None})
    return form


def submit(client: Client, args: argparse.Namespace) -> dict[str, Any]:
    files = None
    if args.image is not None:
        path = Path(args.image)
        if not path.is_file():
            raise CliError(f"{path}: no such file", code=2)
        files = {"image": (path.name, path.read_bytes(), "application/octet-stream")}
    headers = {"Cache-Control": "no-cache"} if args.no_cache else {}
    job: dict[str, Any] = client.call("POST", "/v1/jobs", data=job_form(args), files=files, headers=headers)
    return job


class Printer:
    """Tokens to stdout as they come (plain mode), or nothing until the end (--json)."""

    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json
        self.parts: list[str] = []
        self.attempt = 1

    def token(self, event: dict[str, Any]) -> None:
        if event.get("attempt", 1) != self.attempt:  # a retried job starts its answer over
            self.attempt, self.parts = event.get("attempt", 1), []
            self.note("\n[the job was retried: its answer starts over]")
        self.parts.append(event.get("text") or "")
        if not self.as_json:
            sys.stdout.write(event.get("text") or "")
            sys.stdout.flush()

    @staticmethod
    def note(text: str) -> None:
        print(text, file=sys.stderr, flush=True)


def follow(client: Client, job_id: str, printer: Printer) -> dict[str, Any]:
    for event in client.events(job_id):
        if event.get("type") == "token":
            printer.token(event)
        elif is_terminal(event):
            return event
    raise CliError(f"the stream of job {job_id} ended before the job did")


def run_ask(client: Client, args: argparse.Namespace) -> int:
    job = submit(client, args)
    printer = Printer(args.json)
    try:
        end = follow(client, job["id"], printer)
    except KeyboardInterrupt:
        client.call("DELETE", f"/v1/jobs/{job['id']}")
        printer.note(f"\ncancelled job {job['id']}")
        return 130
    status = "done" if end.get("type") == "done" else str(end.get("status"))
    text = "".join(printer.parts) if printer.parts else end.get("final_text") or ""
    if args.json:
        print(json.dumps(result(job, end, status, text)))
    else:
        print("" if printer.parts else text)
        printer.note(summary(job, end, status))
    return 0 if status == "done" else 1


def result(job: dict[str, Any], end: dict[str, Any], status: str, text: str) -> dict[str, Any]:
    return {
        "id": job["id"],
        "session_id": job["session_id"],
        "status": status,
        "text": text,
        "finish_reason": end.get("finish_reason"),
        "error": end.get("error"),
        "usage": end.get("usage"),
        "timings": end.get("timings"),
        "result_cached": job.get("result_cached", False),
    }


def summary(job: dict[str, Any], end: dict[str, Any], status: str) -> str:
    timings, usage = end.get("timings") or {}, end.get("usage") or {}
    parts = [f"{status}" + (f": {end['error']}" if end.get("error") else ""), f"job {job['id']}"]
    parts.append(f"TTFT {ms(timings.get('ttft'))}, total {ms(timings.get('total'))}")
    tokens, generation = usage.get("completion_tokens", 0), timings.get("generation", 0.0)
    if tokens > 1 and generation > 0:
        parts.append(f"{(tokens - 1) / generation:.1f} tokens/s")
    parts.append(f"{tokens} tokens")
    return " · ".join(parts) + f'\nfollow up: vlmq ask --session {job["session_id"]} "..."'
