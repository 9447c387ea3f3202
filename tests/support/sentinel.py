"""A real Redis master + replica + Sentinel on free local ports, for the high-availability tests.

Debian has no ``redis-sentinel`` binary here; ``redis-server <conf> --sentinel`` is the same
program. A sentinel rewrites its config file (it records the replicas and the current master),
so each gets a writable file in the cluster's temporary directory. Timings are short
(``down-after-milliseconds`` 1000, ``failover-timeout`` 3000) so a failover takes seconds.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from scripts.pdeathsig import term_with_parent
from scripts.redis_launcher import free_port, reachable, redis_binary

MASTER_NAME = "vlmqtest"


@dataclass
class Node:
    """One redis-server process (data node or sentinel) on 127.0.0.1."""

    port: int
    process: subprocess.Popen[bytes]
    log_path: Path

    def client(self, timeout_s: float = 2.0) -> redis.Redis:
        return redis.Redis(port=self.port, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)

    def alive(self) -> bool:
        return self.process.poll() is None

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.alive():
            self.process.send_signal(sig)
            self.process.wait(10)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


@dataclass
class SentinelCluster:
    """Master + replica(s) + sentinel(s); ``url`` is the Celery-style sentinel URL."""

    workdir: Path
    master_name: str = MASTER_NAME
    data: list[Node] = field(default_factory=list)
    sentinels: list[Node] = field(default_factory=list)

    @property
    def url(self) -> str:
        return ";".join(f"sentinel://127.0.0.1:{s.port}/0" for s in self.sentinels)

    def sentinel_client(self) -> redis.Redis:
        return self.sentinels[0].client()

    def master_port(self) -> int:
        """The master as clients see it: ``SENTINEL MASTER`` (what redis-py and kombu ask), which
        changes at +switch-master; GET-MASTER-ADDR-BY-NAME names the promoted replica earlier."""
        state: Any = self.sentinel_client().sentinel_master(self.master_name)
        return int(state["port"])

    def master(self) -> Node:
        port = self.master_port()
        return next(n for n in self.data if n.port == port)

    def replicas(self) -> list[Node]:
        port = self.master_port()
        return [n for n in self.data if n.port != port and n.alive()]

    def failover(self, timeout_s: float = 30.0) -> float:
        """``SENTINEL FAILOVER``; returns the seconds until a replica answers as master."""
        old = self.master_port()
        started = time.monotonic()
        self.sentinel_client().execute_command("SENTINEL", "FAILOVER", self.master_name)
        self.wait_new_master(old, timeout_s)
        return time.monotonic() - started

    def wait_new_master(self, old_port: int, timeout_s: float = 30.0) -> int:
        """Wait until the sentinels name another master and it answers as one (role master)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            port = self.master_port()
            if port != old_port and _role(port) == "master":
                return port
            time.sleep(0.05)
        raise TimeoutError(f"no new master within {timeout_s}s:\n{self.logs()}")

    def wait_replicas_in_sync(self, count: int = 1, timeout_s: float = 30.0) -> None:
        """Wait until the master has ``count`` online replicas (and the sentinel knows them)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            info = self.master().client().info("replication")
            online = sum(1 for k, v in info.items() if k.startswith("slave") and v.get("state") == "online")
            known = self.sentinel_client().sentinel_slaves(self.master_name)
            up = [r for r in known if not r["is_sdown"] and r.get("master-link-status") == "ok"]
            if online >= count and len(up) >= count:
                return
            time.sleep(0.1)
        raise TimeoutError(f"{count} replica(s) not in sync within {timeout_s}s:\n{self.logs()}")

    def stop(self) -> None:
        for node in [*self.sentinels, *self.data]:
            node.kill(signal.SIGKILL)
        shutil.rmtree(self.workdir, ignore_errors=True)

    def logs(self, tail: int = 3000) -> str:
        nodes = [(f"redis {n.port}", n) for n in self.data] + [
            (f"sentinel {n.port}", n) for n in self.sentinels
        ]
        return "\n".join(f"----- {name} -----\n{n.log()[-tail:]}" for name, n in nodes)


def start_cluster(replicas: int = 1, sentinels: int = 1, timeout_s: float = 30.0) -> SentinelCluster:
    """Start a master, ``replicas`` replicas of it and ``sentinels`` sentinels watching it."""
    cluster = SentinelCluster(Path(tempfile.mkdtemp(prefix="vlmq-sentinel-")))
    try:
        master = _start_data_node(cluster.workdir, None)
        cluster.data.append(master)
        for _ in range(replicas):
            cluster.data.append(_start_data_node(cluster.workdir, master.port))
        quorum = sentinels // 2 + 1
        for _ in range(sentinels):
            cluster.sentinels.append(_start_sentinel(cluster.workdir, master.port, quorum))
        if replicas:
            cluster.wait_replicas_in_sync(replicas, timeout_s)
    except BaseException:
        cluster.stop()
        raise
    return cluster


def _start_data_node(workdir: Path, master_port: int | None) -> Node:
    port = free_port()
    node_dir = workdir / f"redis-{port}"
    node_dir.mkdir()
    args = ["--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    args += ["--dir", str(node_dir), "--loglevel", "notice", "--repl-diskless-sync-delay", "0"]
    if master_port is not None:
        args += ["--replicaof", "127.0.0.1", str(master_port)]
    node = _spawn([redis_binary(), *args], node_dir / "redis.log", port)
    _wait_answers(node)
    return node


def _start_sentinel(workdir: Path, master_port: int, quorum: int) -> Node:
    port = free_port()
    conf = workdir / f"sentinel-{port}.conf"
    conf.write_text(
        f"port {port}\nbind 127.0.0.1\ndir {workdir}\n"
        f"sentinel monitor {MASTER_NAME} 127.0.0.1 {master_port} {quorum}\n"
        f"sentinel down-after-milliseconds {MASTER_NAME} 1000\n"
        f"sentinel failover-timeout {MASTER_NAME} 3000\n"
        f"sentinel parallel-syncs {MASTER_NAME} 1\n"
    )
    node = _spawn([redis_binary(), str(conf), "--sentinel"], workdir / f"sentinel-{port}.log", port)
    _wait_answers(node)
    return node


def _spawn(cmd: list[str], log_path: Path, port: int) -> Node:
    log = open(log_path, "wb")  # noqa: SIM115  (owned by the child)
    process = subprocess.Popen(
        cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=term_with_parent
    )
    log.close()
    return Node(port, process, log_path)


def _wait_answers(node: Node, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not node.alive():
            raise RuntimeError(f"redis-server on {node.port} exited:\n{node.log()[-2000:]}")
        if reachable(f"redis://127.0.0.1:{node.port}", 0.2):
            return
        time.sleep(0.05)
    raise TimeoutError(f"redis-server on {node.port} did not answer within {timeout_s}s")


def _role(port: int) -> str | None:
    try:
        role = redis.Redis(port=port, socket_timeout=1, socket_connect_timeout=1).execute_command("ROLE")
    except redis.RedisError:
        return None
    kind = role[0]
    return kind.decode() if isinstance(kind, bytes) else str(kind)
