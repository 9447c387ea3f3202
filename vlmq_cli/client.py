"""The HTTP side of every command: base URL, API key, the server's errors as ``CliError``, SSE."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx

DEFAULT_URL = "http://127.0.0.1:8000"


class CliError(Exception):
    """What went wrong, said once on stderr; the command exits with ``code``."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def headers_for(key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"} if key else {}


def check(response: httpx.Response) -> Any:
    """The JSON of a 2xx answer, else CliError with the server's own message."""
    if response.is_success:
        return response.json()
    raise CliError(f"{response.status_code} {server_message(response)}{_hint(response)}")


def server_message(response: httpx.Response) -> str:
    try:
        error = response.json().get("error", {})
        return str(error.get("message") if isinstance(error, dict) else error) or response.reason_phrase
    except (ValueError, AttributeError):
        return response.text[:200] or response.reason_phrase


def _hint(response: httpx.Response) -> str:
    if response.status_code == 401:
        return " (set VLMQ_API_KEY or pass --key)"
    if response.status_code == 429 and response.headers.get("retry-after"):
        return f" (retry after {response.headers['retry-after']} s)"
    return ""


class Client:
    """One HTTP connection pool to the service; a context manager."""

    def __init__(self, url: str, key: str | None, timeout_s: float = 60.0) -> None:
        self.http = httpx.Client(base_url=url.rstrip("/"), headers=headers_for(key), timeout=timeout_s)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.http.close()

    def call(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            return check(self.http.request(method, path, **kwargs))
        except httpx.HTTPError as exc:
            raise CliError(f"cannot reach {self.http.base_url}: {exc}") from None

    def events(self, job_id: str) -> Iterator[dict[str, Any]]:
        """The job's SSE events as dicts, until the server ends the stream."""
        try:
            with self.http.stream("GET", f"/v1/jobs/{job_id}/events", timeout=None) as response:
                if not response.is_success:
                    response.read()
                    check(response)
                yield from parse_sse(response.iter_lines())
        except httpx.HTTPError as exc:
            raise CliError(f"the stream of job {job_id} broke: {exc}") from None


def parse_sse(lines: Iterator[str]) -> Iterator[dict[str, Any]]:
    """``data:`` lines of an SSE stream -> JSON objects (comments and other fields skipped)."""
    data: list[str] = []
    for line in lines:
        if line.startswith("data:"):
            data.append(line[5:].removeprefix(" "))
        elif not line and data:
            yield json.loads("\n".join(data))
            data = []
