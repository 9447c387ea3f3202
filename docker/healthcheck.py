"""Container healthchecks: ``python docker/healthcheck.py gateway|decode|inference``.

Exit 0 when healthy, else 1 with the reason on stderr. Each checks the process's real work, not
that a PID exists:

- gateway: ``GET /readyz`` answers 200 (Redis reachable, a live inference worker with the model).
- decode: this container's Celery node (``decode@<hostname>``) answers a ping over the broker.
- flower: its ``/healthcheck`` page answers (open without credentials by design).
- inference: this worker's own heartbeat key (``<prefix>:worker:<id>``, TTL
  ``VLMQ_WORKER_STALE_S``) exists and says healthy. The worker id is ``VLMQ_WORKER_ID`` when set
  (Kubernetes: the pod name), else the hostname, which is what docker-compose.yml gives it.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import urllib.request
from collections.abc import Callable

TIMEOUT_S = 5.0
PING_TIMEOUT_S = 3.0  # a live node answers in milliseconds; keep a failing probe short


def worker_id() -> str:
    return os.environ.get("VLMQ_WORKER_ID") or socket.gethostname()


def check_gateway() -> str | None:
    from shared.config import GatewaySettings

    return _http_ok(f"http://127.0.0.1:{GatewaySettings().port}/readyz")


def _http_ok(url: str) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as resp:
            return None if resp.status == 200 else f"{url}: {resp.status}"
    except OSError as exc:  # HTTPError (503: not ready) is an OSError too
        return f"{url}: {exc}"


def check_decode() -> str | None:
    from worker.celery_app import app

    node = f"decode@{socket.gethostname()}"
    replies = app.control.ping(destination=[node], timeout=PING_TIMEOUT_S)
    return None if any(node in reply for reply in replies) else f"{node} did not answer a ping"


def check_flower() -> str | None:
    return _http_ok(f"http://127.0.0.1:{os.environ.get('FLOWER_PORT', '5555')}/healthcheck")


def check_inference() -> str | None:
    import redis

    from shared.config import CommonSettings

    settings = CommonSettings()
    key = settings.keys.worker_heartbeat(worker_id())
    client = redis.Redis.from_url(settings.redis_url, socket_timeout=TIMEOUT_S)
    raw = client.get(key)
    if raw is None:
        return f"no heartbeat at {key}"
    beat = json.loads(raw)
    return None if beat.get("healthy") else f"worker unhealthy: {beat.get('last_error')}"


CHECKS: dict[str, Callable[[], str | None]] = {
    "gateway": check_gateway,
    "decode": check_decode,
    "inference": check_inference,
    "flower": check_flower,
}


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0] not in CHECKS:
        print(f"usage: healthcheck.py {'|'.join(CHECKS)}", file=sys.stderr)
        return 2
    try:
        problem = CHECKS[argv[0]]()
    except Exception as exc:  # Redis down, bad settings...: unhealthy, with the reason
        problem = f"{type(exc).__name__}: {exc}"
    if problem:
        print(problem, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
