"""Rendered Kubernetes manifests of ``k8s/`` for the deploy tests: build, look up, expand.

``kubectl kustomize`` renders each build once per test session. The helpers read the result
the way the kubelet would (``$(VAR)`` expansion, ConfigMap env, the settings a pod really
gets), so the tests check what a cluster would run rather than the YAML's text.
"""

from __future__ import annotations

import functools
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "k8s"
NAMESPACE = "vlmq"
# What a newcomer applies, and the documented variants built on them.
OVERLAYS = ("overlays/cpu", "overlays/gpu")
EXAMPLES = ("examples/managed-redis", "examples/real-checkpoint")
BUILDS = OVERLAYS + EXAMPLES
GPU_BUILDS = ("overlays/gpu", "examples/real-checkpoint")
EXTERNAL_REDIS_BUILDS = ("examples/managed-redis",)
SETTINGS_CONFIGMAP = "vlmq-settings"
SECRET = "vlmq-secrets"

Obj = dict[str, Any]
_VAR_REF = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


INSTALL_KUBECTL = (
    "Install kubectl >= 1.27 (it bundles kustomize v5): the Kubernetes apt repository "
    "(pkgs.k8s.io), Google Cloud's `kubectl` package, or the binary from dl.k8s.io. "
    "Debian's `kubernetes-client` (1.20) is too old: its kustomize has no components."
)


@functools.cache
def kubectl() -> str:
    """kubectl's path; fails (never skips) without one whose kustomize reads k8s/."""
    path = shutil.which("kubectl")
    if path is None:
        pytest.fail(
            f"kubectl is not on PATH: k8s/ is rendered with `kubectl kustomize`. {INSTALL_KUBECTL}",
            pytrace=False,
        )
    proc = subprocess.run(
        [path, "version", "--client", "-o", "json"], capture_output=True, text=True, timeout=30
    )
    found = json.loads(proc.stdout or "{}").get("kustomizeVersion", "") if proc.returncode == 0 else ""
    major = re.match(r"v(\d+)\.", found)
    if major is None or int(major.group(1)) < 5:
        pytest.fail(
            f"{path} bundles kustomize {found or '(unknown)'}, k8s/ needs v5+. {INSTALL_KUBECTL}",
            pytrace=False,
        )
    return path


@functools.cache
def _render(build: str) -> str:
    proc = subprocess.run(
        [kubectl(), "kustomize", str(K8S / build)], capture_output=True, text=True, timeout=120
    )
    if proc.returncode != 0:
        pytest.fail(f"`kubectl kustomize k8s/{build}` failed:\n{proc.stderr}", pytrace=False)
    return proc.stdout


def render(build: str) -> list[Obj]:
    """The objects of one build (a fresh copy: tests may change theirs)."""
    return [doc for doc in yaml.safe_load_all(_render(build)) if doc]


def of_kind(objs: list[Obj], kind: str) -> list[Obj]:
    return [o for o in objs if o["kind"] == kind]


def named(objs: list[Obj], kind: str, name: str) -> Obj:
    found = [o for o in of_kind(objs, kind) if o["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind}/{name}, found {len(found)}"
    return found[0]


def component(obj: Obj) -> str:
    return str(obj["metadata"]["labels"]["app.kubernetes.io/component"])


def deployment(objs: list[Obj], comp: str) -> Obj:
    found = [d for d in of_kind(objs, "Deployment") if component(d) == comp]
    assert len(found) == 1, f"expected one Deployment of component {comp}, found {len(found)}"
    return found[0]


def pod_spec(workload: Obj) -> Obj:
    spec: Obj = workload["spec"]["template"]["spec"]
    return spec


def main_container(workload: Obj) -> Obj:
    containers: list[Obj] = pod_spec(workload)["containers"]
    assert len(containers) == 1, f"{workload['metadata']['name']}: one container expected"
    return containers[0]


def settings_configmap(objs: list[Obj]) -> Obj:
    found = [c for c in of_kind(objs, "ConfigMap") if c["metadata"]["name"].startswith(SETTINGS_CONFIGMAP)]
    assert len(found) == 1, f"expected one {SETTINGS_CONFIGMAP} ConfigMap, found {len(found)}"
    return found[0]


def settings(objs: list[Obj]) -> dict[str, str]:
    data: dict[str, str] = settings_configmap(objs).get("data", {})
    return data


def configmap_env(objs: list[Obj], container: Obj) -> dict[str, str]:
    """Variables a container gets through ``envFrom`` (each ConfigMap must exist)."""
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        assert "configMapRef" in source, f"{container['name']}: envFrom only from ConfigMaps"
        env.update(named(objs, "ConfigMap", source["configMapRef"]["name"]).get("data", {}))
    return env


def env_entries(container: Obj) -> dict[str, Obj]:
    return {e["name"]: e for e in container.get("env", [])}


def var_refs(text: str) -> list[str]:
    return [m.group(1) for m in _VAR_REF.finditer(text) if m.group(1)]


def expand(text: str, env: dict[str, str]) -> str:
    """The kubelet's ``$(VAR)`` expansion: defined names are replaced, ``$$`` is ``$``."""

    def one(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))

    return _VAR_REF.sub(one, text)


def probes(container: Obj) -> dict[str, Obj]:
    return {
        kind: container[kind]
        for kind in ("startupProbe", "livenessProbe", "readinessProbe")
        if kind in container
    }


def prestop_sleep_s(container: Obj) -> int:
    """Seconds of a ``preStop: exec: [sleep, N]`` hook (0 without one)."""
    command = container.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", [])
    return int(command[1]) if command[:1] == ["sleep"] else 0


def keda_triggers(objs: list[Obj], target: str) -> list[Obj]:
    scaled = [s for s in of_kind(objs, "ScaledObject") if s["spec"]["scaleTargetRef"]["name"] == target]
    assert len(scaled) == 1, f"expected one ScaledObject for {target}, found {len(scaled)}"
    triggers: list[Obj] = scaled[0]["spec"]["triggers"]
    return triggers


def selects(selector: Obj, labels: dict[str, str]) -> bool:
    """Does a label selector (matchLabels + matchExpressions with In/NotIn/Exists) match?"""
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for expr in selector.get("matchExpressions", []):
        key, op, values = expr["key"], expr["operator"], expr.get("values", [])
        ok = {
            "In": labels.get(key) in values,
            "NotIn": labels.get(key) not in values,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }[op]
        if not ok:
            return False
    return True


def walk(node: Any) -> list[Obj]:
    """Every mapping inside ``node`` (itself included), depth first."""
    found: list[Obj] = []
    if isinstance(node, dict):
        found.append(node)
        for value in node.values():
            found.extend(walk(value))
    elif isinstance(node, list):
        for value in node:
            found.extend(walk(value))
    return found
