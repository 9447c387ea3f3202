"""Commands and probes of k8s/, run as the kubelet would, against real processes.

Inference: the rendered probe scripts read a heartbeat written by the real
``InferenceWorker.heartbeat`` (so a change of its key or fields breaks them here, not in a
cluster). Decode: the rendered Celery command starts a node named as in a pod, and the
rendered probe pings it, and only it. Redis: the rendered command starts a redis-server on
the rendered redis.conf, which Redis itself then reports as persistent, non-evicting and
password-protected.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import redis

from scripts.redis_launcher import free_port, redis_binary
from services.inference_worker.image_inputs import ImageInputCache
from shared.config import InferenceSettings
from shared.keys import Keys
from tests.deploy.manifests import (
    BUILDS,
    ROOT,
    Obj,
    configmap_env,
    deployment,
    env_entries,
    expand,
    main_container,
    named,
    pod_spec,
    probes,
    render,
)
from tests.support.processes import ManagedProcess, log_contains

POD = "vlmq-inference-7d9f8b6c5d-x2x9q"  # what the downward API gives VLMQ_WORKER_ID


def pod_env(objs: list[Obj], container: Obj, redis_url: str, keys: Keys, hostname: str) -> dict[str, str]:
    """The container's environment as the kubelet builds it, pointed at the test's Redis."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLMQ_")}
    env.update(configmap_env(objs, container))
    for name, entry in env_entries(container).items():
        if "value" in entry:
            env[name] = expand(entry["value"], env)
    env.update(
        {
            "VLMQ_REDIS_URL": redis_url,  # the Deployment composes it from the Secret's password
            "VLMQ_ENV": "development",  # the test's Redis has no password, which production refuses
            "VLMQ_KEY_PREFIX": keys.prefix,
            "HOSTNAME": hostname,  # a pod's hostname is its name
            "PYTHONPATH": str(ROOT),
            "HOME": env.get("HOME", "/tmp"),
        }
    )
    return env


def run_probe(probe: Obj, env: dict[str, str]) -> int:
    command = [sys.executable if part == "python" else part for part in probe["exec"]["command"]]
    if command[0] == "sh":  # the shell's `exec python ...`
        command[-1] = command[-1].replace("exec python ", f"exec {sys.executable} ", 1)
    done = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, timeout=probe["timeoutSeconds"])
    return done.returncode


def write_heartbeat(client: redis.Redis, keys: Keys, *, healthy: bool, stopping: bool) -> None:
    """One beat from the real ``InferenceWorker.heartbeat``, on a stand-in for the worker."""
    from services.inference_worker.loop import InferenceWorker  # torch, transformers: only this test
    from services.inference_worker.task_events import TaskEvents

    stop = threading.Event()
    if stopping:
        stop.set()
    settings = InferenceSettings(key_prefix=keys.prefix, _env_file=None)  # type: ignore[call-arg]
    worker = SimpleNamespace(
        worker_id=POD,
        settings=settings,
        task_events=TaskEvents(settings, POD),  # off by default: publishes nothing
        healthy=healthy,
        writer=SimpleNamespace(error=None if healthy else "boom", events=0, flushes=0),
        engine=SimpleNamespace(
            last_error=None, config=SimpleNamespace(device="cpu"), stats=lambda: SimpleNamespace(to_dict=dict)
        ),
        _run_ids=list,
        image_inputs=ImageInputCache(0),
        capacity=16,
        stopping=stop,
        r=client,
        keys=keys,
    )
    InferenceWorker.heartbeat(cast(Any, worker))


def test_inference_probes_read_the_heartbeat(redis_url: str, redis_client: redis.Redis, keys: Keys) -> None:
    objs = render("overlays/cpu")
    container = main_container(deployment(objs, "inference"))
    for build in BUILDS:  # one set of probes everywhere: checking these checks them all
        assert probes(main_container(deployment(render(build), "inference"))) == probes(container), build
    env = pod_env(objs, container, redis_url, keys, POD)
    env["VLMQ_WORKER_ID"] = POD  # downward API: metadata.name
    found = probes(container)
    startup, live, ready = found["startupProbe"], found["livenessProbe"], found["readinessProbe"]

    # Loading the model: no heartbeat yet.
    assert [run_probe(p, env) for p in (startup, live, ready)] == [1, 1, 1]
    write_heartbeat(redis_client, keys, healthy=True, stopping=False)
    assert [run_probe(p, env) for p in (startup, live, ready)] == [0, 0, 0]
    # Draining after SIGTERM: alive, but takes no new work.
    write_heartbeat(redis_client, keys, healthy=True, stopping=True)
    assert [run_probe(p, env) for p in (live, ready)] == [0, 1]
    # Engine unhealthy: restart it.
    write_heartbeat(redis_client, keys, healthy=False, stopping=False)
    assert [run_probe(p, env) for p in (live, ready)] == [1, 1]
    # Another pod's heartbeat is not ours.
    write_heartbeat(redis_client, keys, healthy=True, stopping=False)
    assert run_probe(live, {**env, "VLMQ_WORKER_ID": "vlmq-inference-other"}) == 1


def test_decode_probe_pings_its_own_node(redis_url: str, keys: Keys, tmp_path: Path) -> None:
    objs = render("overlays/cpu")
    container = main_container(deployment(objs, "decode"))
    hostname = socket.gethostname()  # Celery's %h, as $HOSTNAME is in a pod
    env = pod_env(objs, container, redis_url, keys, hostname)
    command = [expand(part, env) for part in container["command"]]
    command[0] = sys.executable
    worker = ManagedProcess("decode", command, env, tmp_path / "decode.log", ready=log_contains(" ready."))
    found = probes(container)
    assert len({str(p["exec"]) for p in found.values()}) == 1, "one check, three patiences"
    probe = found["livenessProbe"]
    other = {**env, "HOSTNAME": "vlmq-decode-other"}  # another pod's name: no answer for it
    worker.start()
    try:
        worker.wait_ready(60)
        # A probe without an answer waits out its Celery timeout: run both side by side.
        with ThreadPoolExecutor(2) as pool:
            own, others = pool.map(run_probe, [probe, probe], [env, other])
        assert own == 0, worker.log()[-3000:]
        assert others != 0
    finally:
        worker.stop(timeout_s=20)


def test_redis_runs_on_the_rendered_config(tmp_path: Path) -> None:
    objs = render("overlays/cpu")
    statefulset = named(objs, "StatefulSet", "vlmq-redis")
    container = main_container(statefulset)
    config = next(v for v in pod_spec(statefulset)["volumes"] if v["name"] == "config")
    conf = named(objs, "ConfigMap", config["configMap"]["name"])["data"]["redis.conf"]
    script = container["args"][0]
    # The pod's mounts (data volume, config, the password's tmpfs) become local directories.
    for mount in container["volumeMounts"]:
        local = tmp_path / mount["name"]
        local.mkdir()
        conf, script = (
            conf.replace(mount["mountPath"], str(local)),
            script.replace(mount["mountPath"], str(local)),
        )
    port = free_port()
    (tmp_path / "config" / "redis.conf").write_text(f"{conf}\nport {port}\nbind 127.0.0.1\n")
    script = script.replace("exec redis-server ", f"exec {redis_binary()} ", 1)
    env = {"PATH": os.environ["PATH"], "REDISCLI_AUTH": "s3cret"}  # the Secret's REDIS_PASSWORD
    ready = log_contains("Ready to accept connections")
    server = ManagedProcess("redis", ["sh", "-c", script], env, tmp_path / "redis.log", ready=ready)
    server.start()
    try:
        server.wait_ready(10)  # raises with the log if redis-server refused the config
        client = redis.Redis(port=port, password="s3cret", socket_timeout=2)
        config_of = cast(Any, client).config_get
        assert config_of("appendonly")["appendonly"] == "yes"
        assert config_of("maxmemory-policy")["maxmemory-policy"] == "noeviction"
        assert int(config_of("maxmemory")["maxmemory"]) > 0  # refuses writes before the pod's limit
        with socket.create_connection(("127.0.0.1", port), timeout=2) as conn:  # no password: refused
            conn.sendall(b"PING\r\n")
            assert conn.recv(100).startswith(b"-NOAUTH")
        assert (tmp_path / "run" / "auth.conf").stat().st_mode & 0o077 == 0  # the password file: owner only
    finally:
        server.stop()
