"""k8s/: every overlay renders, validates against Kubernetes' and KEDA's schemas, and keeps
the promises the service depends on (probes, drains, scaling, the Redis names in shared/).

Schemas: Kubernetes ``K8S_VERSION`` from PyPI ``kubernetes-validate`` (strict: an unknown
field is an error, as with ``kubectl apply``'s default server-side field validation); KEDA's
CRDs copied into ``k8s/schemas/keda`` (source and version in its README), made strict the
same way. Fails, not skips, without kubectl.
"""

from __future__ import annotations

import copy
import functools
import os
import re
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from gateway.metrics_redis import BACKLOG_METRIC
from scripts.commands import BATCH_NICE, decode_command, gateway_command, inference_command
from scripts.up import UpSettings
from shared.config import CommonSettings, DecodeWorkerSettings, GatewaySettings, InferenceSettings
from shared.decode_task import BATCH_QUEUE, DECODE_QUEUE, QUEUES
from shared.keys import Keys
from tests.deploy.manifests import (
    BUILDS,
    EXTERNAL_REDIS_BUILDS,
    GPU_BUILDS,
    K8S,
    NAMESPACE,
    SECRET,
    Obj,
    component,
    configmap_env,
    deployment,
    env_entries,
    expand,
    keda_triggers,
    main_container,
    named,
    of_kind,
    pod_spec,
    prestop_sleep_s,
    probes,
    render,
    selects,
    settings,
    var_refs,
    walk,
)

K8S_VERSION = "1.31"
KEDA_CRDS = K8S / "schemas" / "keda"
SETTINGS_CLASSES = (CommonSettings, GatewaySettings, DecodeWorkerSettings, InferenceSettings)
NETWORK_SETTINGS = {"VLMQ_REDIS_URL", "VLMQ_HOST", "VLMQ_PORT"}  # set by the manifests, never the ConfigMap
# Decode Deployments by role (scripts/commands.py decode_command(role=...)) and their one queue.
DECODES = {"decode": ("interactive", DECODE_QUEUE), "decode-batch": ("batch", BATCH_QUEUE)}
WORKERS = (*DECODES, "inference")
APPS = ("gateway", *WORKERS, "flower")

# What KEDA v2.20.2 reads (pkg/scalers/redis_scaler.go, prometheus_scaler.go). It ignores
# any other key: a misspelt `lagcount` would quietly scale on pending entries instead.
REDIS_CONNECTION = {"address", "addresses", "host", "hosts", "port", "ports", "username", "password"}
REDIS_CONNECTION |= {"sentinelUsername", "sentinelPassword", "sentinelMaster", "unsafeSsl"}
TRIGGER_METADATA = {
    "redis": REDIS_CONNECTION
    | {"listName", "listLength", "activationListLength", "databaseIndex", "enableTLS"},
    "prometheus": {
        "serverAddress",
        "query",
        "threshold",
        "activationThreshold",
        "namespace",
        "ignoreNullValues",
    },
}
AUTH_PARAMS = REDIS_CONNECTION - {"unsafeSsl"} | {"tls", "cert", "Cert", "key", "keyPassword", "ca"}

builds = pytest.mark.parametrize("build", BUILDS)


def setting_names(*classes: type[Any]) -> set[str]:
    return {f"VLMQ_{name.upper()}" for cls in classes for name in cls.model_fields}


def setting_value(objs: list[Obj], cls: type[Any], name: str) -> Any:
    """A setting as the pods get it: the ConfigMap's value, else the field's default."""
    raw = settings(objs).get(f"VLMQ_{name.upper()}")
    return cls.model_fields[name].default if raw is None else raw


# --- schemas ---


def _strict(schema: Any) -> Any:
    """Unknown fields become errors, as the API server's strict field validation makes them."""
    if isinstance(schema, list):
        return [_strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _strict(v) for k, v in schema.items()}
    open_ended = "additionalProperties" in out or out.get("x-kubernetes-preserve-unknown-fields")
    if out.get("type") == "object" and "properties" in out and not open_ended:
        out["additionalProperties"] = False
    return out


@functools.cache
def keda_validators() -> dict[tuple[str, str], jsonschema.protocols.Validator]:
    """(apiVersion, kind) -> validator, for each served version of each copied KEDA CRD."""
    validators: dict[tuple[str, str], jsonschema.protocols.Validator] = {}
    for path in sorted(KEDA_CRDS.glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
        for version in crd["spec"]["versions"]:
            if version.get("served"):
                schema = _strict(version["schema"]["openAPIV3Schema"])
                jsonschema.Draft7Validator.check_schema(schema)
                validators[(f"{group}/{version['name']}", kind)] = jsonschema.Draft7Validator(schema)
    assert validators, f"no KEDA CRD in {KEDA_CRDS}"
    return validators


def schema_errors(obj: Obj) -> list[str]:
    """Why ``obj`` does not validate (empty: it does)."""
    where = f"{obj['kind']}/{obj['metadata']['name']}"
    if obj["apiVersion"].split("/")[0].endswith("keda.sh"):
        validator = keda_validators().get((obj["apiVersion"], obj["kind"]))
        if validator is None:
            return [f"{where}: no copied KEDA CRD serves {obj['apiVersion']} {obj['kind']}"]
        return [f"{where}: {'.'.join(map(str, e.path))}: {e.message}" for e in validator.iter_errors(obj)]
    try:
        used = kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    except kubernetes_validate.ValidationError as e:
        return [f"{where}: {'.'.join(map(str, e.path))}: {e.message}"]
    except kubernetes_validate.SchemaNotFoundError as e:  # a kind/apiVersion unknown to K8S_VERSION
        return [f"{where}: {e.message}"]
    return [] if used == K8S_VERSION else [f"{where}: validated against {used}, not {K8S_VERSION}"]


@builds
def test_every_object_validates(build: str) -> None:
    objs = render(build)
    assert {"Deployment", "Service", "ConfigMap", "ScaledObject"} <= {o["kind"] for o in objs}
    errors = [err for obj in objs for err in schema_errors(obj)]
    assert not errors, "\n".join(errors)


def test_validation_can_fail() -> None:
    """The validators reject a misspelt field and a wrong type (they are not no-ops)."""
    objs = render("overlays/cpu")
    dep = copy.deepcopy(deployment(objs, "gateway"))
    dep["spec"]["strategy"]["rollingUpdate"]["maxUnavailabel"] = 0
    assert schema_errors(dep)
    scaled = copy.deepcopy(named(objs, "ScaledObject", "vlmq-decode"))
    scaled["spec"]["minReplicaCont"] = 1
    assert schema_errors(scaled)
    scaled = copy.deepcopy(named(objs, "ScaledObject", "vlmq-decode"))
    scaled["spec"]["triggers"][0]["metadata"]["listLength"] = 10  # metadata values are strings
    assert schema_errors(scaled)


def test_secret_template() -> None:
    """The template validates and holds placeholders only; no build renders a Secret."""
    secret = yaml.safe_load((K8S / "secret.example.yaml").read_text())
    assert schema_errors(secret) == []
    assert secret["metadata"]["name"] == SECRET
    assert all(v and ("change-me" in v or v == "admin") for v in secret["stringData"].values())
    for build in BUILDS:
        assert not of_kind(render(build), "Secret"), f"{build} renders a Secret: secrets stay out of git"


@builds
def test_secret_refs_are_documented(build: str) -> None:
    """Every Secret key a pod or KEDA reads is in secret.example.yaml (commented if optional)."""
    template = (K8S / "secret.example.yaml").read_text()
    refs: set[str] = set()
    for obj in render(build):
        for node in walk(obj):
            ref = node.get("secretKeyRef")
            if ref is not None:
                assert ref["name"] == SECRET, ref
                refs.add(ref["key"])
            volume = node.get("secret")
            if isinstance(volume, dict) and "secretName" in volume:
                assert volume["secretName"] == SECRET, volume
                refs.update(item["key"] for item in volume["items"])
        for ref in obj["spec"].get("secretTargetRef", []) if obj["kind"] == "TriggerAuthentication" else []:
            assert ref["name"] == SECRET, ref
            refs.add(ref["key"])
    assert refs
    missing = [k for k in sorted(refs) if not re.search(rf"^\s*#?\s*{k}:", template, re.M)]
    assert not missing, f"secret.example.yaml does not list {missing}"


# --- labels and namespace ---


@builds
def test_labels_and_namespace(build: str) -> None:
    for obj in render(build):
        where = f"{obj['kind']}/{obj['metadata']['name']}"
        labels = obj["metadata"].get("labels", {})
        assert labels.get("app.kubernetes.io/name") == "vlmq", where
        assert labels.get("app.kubernetes.io/part-of") == "vlmq", where
        assert labels.get("app.kubernetes.io/component"), where
        assert obj["metadata"].get("namespace") == NAMESPACE, f"{where}: namespace"
        if obj["kind"] in ("Deployment", "StatefulSet"):
            pod_labels = obj["spec"]["template"]["metadata"]["labels"]
            assert pod_labels == labels, f"{where}: pod labels differ from the workload's"
            assert selects(obj["spec"]["selector"], pod_labels), f"{where}: selector"


# --- deployments: rollout, probes, resources, drain ---


@builds
def test_deployments_roll_safely(build: str) -> None:
    objs = render(build)
    drain_s = float(setting_value(objs, InferenceSettings, "drain_timeout_s"))
    assert sorted(component(d) for d in of_kind(objs, "Deployment")) == sorted(APPS)
    for dep in of_kind(objs, "Deployment"):
        name, spec = dep["metadata"]["name"], pod_spec(dep)
        strategy = dep["spec"]["strategy"]
        assert strategy["type"] == "RollingUpdate" and strategy["rollingUpdate"]["maxUnavailable"] == 0, name
        container = main_container(dep)
        found = probes(container)
        assert {"livenessProbe", "readinessProbe"} <= set(found), f"{name}: probes {sorted(found)}"
        for kind, probe in found.items():
            command = " ".join(probe.get("exec", {}).get("command", []))
            wait = re.search(r" -t (\d+)", command)  # a Celery remote-control timeout inside
            if wait:
                assert probe["timeoutSeconds"] > int(wait.group(1)), f"{name} {kind}: timeout"
        resources = container["resources"]
        for part in ("requests", "limits"):
            assert {"cpu", "memory"} <= set(resources.get(part, {})), f"{name}: resources.{part}"
        grace = spec["terminationGracePeriodSeconds"]
        assert grace > drain_s + prestop_sleep_s(container), f"{name}: grace {grace}s vs drain {drain_s}s"
        ctx = container["securityContext"]
        assert ctx["allowPrivilegeEscalation"] is False and spec["securityContext"]["runAsNonRoot"], name


@builds
def test_commands_match_make_up(build: str) -> None:
    """The pods run what `make up` runs (scripts/commands.py), with settings from the env."""
    objs = render(build)

    def command(comp: str) -> list[str]:
        return [str(part) for part in main_container(deployment(objs, comp))["command"]]

    assert command("gateway") == ["python", *gateway_command()[1:]]
    assert command("inference") == ["python", *inference_command()[1:]]
    node = "decode@%h"  # %h: the pod name, which the decode probes ping
    for comp, (role, _) in DECODES.items():
        expected = decode_command("$(VLMQ_DECODE_CONCURRENCY)", "$(VLMQ_LOG_LEVEL)", node, role=role)
        if role == "batch":
            # nice does not reach across containers' cgroups: the pod's CPU request does its work.
            assert expected[:3] == ["nice", "-n", str(BATCH_NICE)]
            expected = expected[3:]
        assert command(comp) == ["python", *expected[1:]], comp
        for probe in probes(main_container(deployment(objs, comp))).values():
            assert '-d "decode@$HOSTNAME"' in probe["exec"]["command"][-1], comp


def cpu_millis(quantity: str | int | float) -> float:
    """A CPU quantity ("500m", "2", 0.5) in millicores."""
    text = str(quantity)
    return float(text[:-1]) if text.endswith("m") else float(text) * 1000


@builds
def test_batch_decode_is_decode_at_a_lower_weight(build: str) -> None:
    """decode-batch is the decode pod on the other queue, with a CPU request (hence cpu.weight)
    at least as far below decode's as `make up`'s nice BATCH_NICE puts its batch node (the
    kernel's weight falls about 1.25x per nice level): batch decoding yields a busy node's
    cores to interactive work, and may still use idle ones up to the same limit."""
    objs = render(build)
    interactive, batch = (main_container(deployment(objs, comp))["resources"] for comp in DECODES)
    ratio = cpu_millis(interactive["requests"]["cpu"]) / cpu_millis(batch["requests"]["cpu"])
    assert ratio >= 1.25**BATCH_NICE, f"interactive/batch CPU requests: {ratio:.1f}"
    assert batch["limits"] == interactive["limits"]

    def without_role(comp: str) -> Obj:
        """The pod spec less what differs by design: container name, queue, resources, labels."""
        spec = copy.deepcopy(pod_spec(deployment(objs, comp)))
        (container,) = spec["containers"]
        for key in ("name", "command", "resources"):
            del container[key]
        for constraint in spec.get("topologySpreadConstraints", []):
            del constraint["labelSelector"]["matchLabels"]["app.kubernetes.io/component"]
        return spec

    assert without_role("decode-batch") == without_role("decode")


@builds
def test_env_is_well_formed(build: str) -> None:
    """Each variable has one source; every $(VAR) is defined before use, as the kubelet needs
    (it leaves an unknown reference as literal text); VLMQ_* names are real settings."""
    objs = render(build)
    known = setting_names(*SETTINGS_CLASSES, UpSettings)
    for workload in of_kind(objs, "Deployment") + of_kind(objs, "StatefulSet"):
        container = main_container(workload)
        where = f"{workload['metadata']['name']}"
        defined = set(configmap_env(objs, container))
        for entry in container.get("env", []):
            assert ("value" in entry) != ("valueFrom" in entry), f"{where} {entry['name']}: one source"
            missing = set(var_refs(entry.get("value", ""))) - defined
            assert not missing, f"{where} {entry['name']}: {missing} undefined before use"
            defined.add(entry["name"])
            if entry["name"].startswith("VLMQ_"):
                assert entry["name"] in known, f"{where}: {entry['name']} is no setting"
        for part in container.get("command", []) + container.get("args", []):
            missing = set(var_refs(part)) - defined
            assert not missing, f"{where}: {missing} undefined in {part!r}"


@builds
def test_configmap_holds_real_settings(build: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Only names of shared/config.py fields, never a network setting, each value valid."""
    data = settings(render(build))
    unknown = set(data) - setting_names(*SETTINGS_CLASSES)
    assert not unknown, f"not settings in shared/config.py: {sorted(unknown)}"
    assert not set(data) & NETWORK_SETTINGS
    for name in list(os.environ):
        if name.startswith("VLMQ_"):
            monkeypatch.delenv(name)
    for key, value in data.items():
        monkeypatch.setenv(key, value)
    # What the Deployments add from the Secret (production refuses to start without them).
    monkeypatch.setenv("VLMQ_REDIS_URL", "redis://:from-the-secret@vlmq-redis:6379/0")
    monkeypatch.setenv("VLMQ_API_KEYS_FILE", "/etc/vlmq/keys/api-keys")
    for cls in SETTINGS_CLASSES:
        cls(_env_file=None)  # raises on a value its field refuses


# --- scaling ---


@builds
def test_one_scaler_per_deployment(build: str) -> None:
    objs = render(build)
    hpa = [h["spec"]["scaleTargetRef"]["name"] for h in of_kind(objs, "HorizontalPodAutoscaler")]
    keda = [s["spec"]["scaleTargetRef"]["name"] for s in of_kind(objs, "ScaledObject")]
    assert not set(hpa) & set(keda), "a Deployment scaled by both an HPA and KEDA"
    assert len(hpa + keda) == len(set(hpa + keda)), "a Deployment with two scalers"
    by_name = {d["metadata"]["name"]: d for d in of_kind(objs, "Deployment")}
    assert [component(by_name[n]) for n in hpa] == ["gateway"]
    assert sorted(component(by_name[n]) for n in keda) == sorted(WORKERS)
    for name in hpa + keda:
        assert "replicas" not in by_name[name]["spec"], f"{name}: the scaler owns replicas"
    for scaled in of_kind(objs, "ScaledObject"):
        assert scaled["spec"].get("scaleTargetRef", {}).get("kind", "Deployment") == "Deployment"
        assert scaled["spec"]["minReplicaCount"] >= 1, "a worker must exist for /readyz"


@builds
def test_scaled_deployments_have_a_pdb(build: str) -> None:
    """One budget each, which still lets a node drain when the scaler is at its minimum."""
    objs = render(build)
    pdbs = of_kind(objs, "PodDisruptionBudget")
    least = {
        h["spec"]["scaleTargetRef"]["name"]: h["spec"]["minReplicas"]
        for h in of_kind(objs, "HorizontalPodAutoscaler")
    }
    least |= {
        s["spec"]["scaleTargetRef"]["name"]: s["spec"]["minReplicaCount"]
        for s in of_kind(objs, "ScaledObject")
    }
    for comp in ("gateway", *WORKERS):
        dep = deployment(objs, comp)
        labels = dep["spec"]["template"]["metadata"]["labels"]
        covering = [p for p in pdbs if selects(p["spec"]["selector"], labels)]
        assert len(covering) == 1, f"{comp}: {len(covering)} PodDisruptionBudgets"
        budget = covering[0]["spec"]
        if "minAvailable" in budget:
            assert budget["minAvailable"] < least[dep["metadata"]["name"]], f"{comp}: blocks node drains"
        else:
            assert budget["maxUnavailable"] >= 1, f"{comp}: blocks node drains"


@builds
def test_keda_reads_the_keys_vlmq_writes(build: str) -> None:
    """Each decode Deployment on LLEN of the one queue it consumes (Keys().decode_queue(q), the
    names from shared/ with the deployment's VLMQ_KEY_PREFIX; every queue of QUEUES has one);
    inference on the backlog of every inference stream, the gateway's ``vlmq_inference_backlog``
    (per-worker streams included), through Prometheus."""
    objs = render(build)
    keys = Keys(setting_value(objs, CommonSettings, "key_prefix"))
    assert sorted(queue for _, queue in DECODES.values()) == sorted(QUEUES)
    decodes: list[tuple[str, Obj]] = []  # (component, trigger)
    for comp, (_, queue) in DECODES.items():
        (trigger,) = keda_triggers(objs, deployment(objs, comp)["metadata"]["name"])
        assert trigger["type"] == "redis", comp
        assert trigger["metadata"]["listName"] == keys.decode_queue(queue), comp
        assert int(trigger["metadata"]["listLength"]) > 0, comp
        decodes.append((comp, trigger))
    (inference,) = keda_triggers(objs, deployment(objs, "inference")["metadata"]["name"])
    assert inference["type"] == "prometheus"
    # every gateway pod reports the cluster's backlog: the max across pods, summed over streams
    assert inference["metadata"]["query"] == f"sum(max by (stream) ({BACKLOG_METRIC}))"
    assert int(inference["metadata"]["threshold"]) > 0
    assert not set(inference["metadata"]) - TRIGGER_METADATA["prometheus"]
    auths = {a["metadata"]["name"]: a for a in of_kind(objs, "TriggerAuthentication")}
    for comp, trigger in decodes:
        unknown = set(trigger["metadata"]) - TRIGGER_METADATA[trigger["type"]]
        assert not unknown, f"{trigger['type']}: KEDA ignores {sorted(unknown)}"
        auth = auths[trigger["authenticationRef"]["name"]]
        params = {ref["parameter"] for ref in auth["spec"]["secretTargetRef"]}
        assert "password" in params and params <= AUTH_PARAMS, f"{sorted(params - AUTH_PARAMS)}"
        if build in EXTERNAL_REDIS_BUILDS:  # the address comes from the Secret
            assert "address" not in trigger["metadata"]
            continue
        # KEDA's operator resolves the address from its own namespace: it must name ours.
        service = named(objs, "Service", "vlmq-redis")
        port = service["spec"]["ports"][0]["port"]
        expected = f"vlmq-redis.{service['metadata']['namespace']}.svc:{port}"
        assert trigger["metadata"]["address"] == expected
        url = env_entries(main_container(deployment(objs, comp)))["VLMQ_REDIS_URL"]["value"]
        assert url.endswith(f"@vlmq-redis:{port}/{trigger['metadata']['databaseIndex']}")


# --- gateway, ingress, flower ---


@builds
def test_gateway_probes_and_ingress(build: str) -> None:
    objs = render(build)
    container = main_container(deployment(objs, "gateway"))
    env = env_entries(container)
    assert env["VLMQ_HOST"]["value"] == "0.0.0.0"
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["http"] == int(env["VLMQ_PORT"]["value"])
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    service = named(objs, "Service", "vlmq-gateway")
    assert service["spec"]["ports"][0]["targetPort"] == "http"
    (ingress,) = of_kind(objs, "Ingress")
    backend = ingress["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]
    assert backend == {"name": "vlmq-gateway", "port": {"name": "http"}}
    assert ingress["spec"]["tls"][0]["secretName"]
    notes = {
        k.removeprefix("nginx.ingress.kubernetes.io/"): v
        for k, v in ingress["metadata"]["annotations"].items()
    }
    assert notes["proxy-buffering"] == "off"  # SSE
    assert int(notes["proxy-read-timeout"]) >= 3600 and int(notes["proxy-send-timeout"]) >= 3600
    body_mib = int(notes["proxy-body-size"].removesuffix("m"))
    max_image = int(setting_value(objs, CommonSettings, "max_image_bytes"))
    assert body_mib * 2**20 > max_image * 4 / 3, "the Ingress refuses base64 images the gateway accepts"


@builds
def test_flower_needs_credentials(build: str) -> None:
    objs = render(build)
    container = main_container(deployment(objs, "flower"))
    assert "--basic-auth=$(VLMQ_FLOWER_USER):$(VLMQ_FLOWER_PASSWORD)" in container["command"]
    env = env_entries(container)
    for name in ("VLMQ_FLOWER_USER", "VLMQ_FLOWER_PASSWORD"):
        assert env[name]["valueFrom"]["secretKeyRef"]["name"] == SECRET
    for dep in of_kind(objs, "Deployment"):  # its API stays behind the credentials
        assert "FLOWER_UNAUTHENTICATED_API" not in env_entries(main_container(dep))


# --- redis ---


in_cluster_redis = pytest.mark.parametrize("build", [b for b in BUILDS if b not in EXTERNAL_REDIS_BUILDS])


@in_cluster_redis
def test_redis_keeps_jobs(build: str) -> None:
    """Persistent (AOF on a volume), never evicts, password from the Secret."""
    objs = render(build)
    redis = named(objs, "StatefulSet", "vlmq-redis")
    assert redis["spec"]["volumeClaimTemplates"][0]["metadata"]["name"] == "data"
    assert any(m["mountPath"] == "/data" for m in main_container(redis)["volumeMounts"])
    conf_volume = next(v for v in pod_spec(redis)["volumes"] if v["name"] == "config")
    conf = named(objs, "ConfigMap", conf_volume["configMap"]["name"])["data"]["redis.conf"]
    lines = {line.strip() for line in conf.splitlines()}
    assert {"appendonly yes", "maxmemory-policy noeviction", "dir /data"} <= lines
    container = main_container(redis)
    assert env_entries(container)["REDISCLI_AUTH"]["valueFrom"]["secretKeyRef"]["name"] == SECRET
    # The password reaches Redis through a file the container writes, never the ConfigMap.
    assert "requirepass" in container["args"][0]
    assert not any(line.startswith("requirepass") for line in lines)


@in_cluster_redis
def test_redis_only_for_vlmq(build: str) -> None:
    """Redis accepts vlmq's pods (each of them) and KEDA's operator, nobody else."""
    objs = render(build)
    redis_labels = named(objs, "StatefulSet", "vlmq-redis")["spec"]["template"]["metadata"]["labels"]
    policies = [p for p in of_kind(objs, "NetworkPolicy") if selects(p["spec"]["podSelector"], redis_labels)]
    assert policies, "Redis is open to every pod"
    peers = [peer for p in policies for rule in p["spec"]["ingress"] for peer in rule["from"]]
    for peer in peers:
        if "namespaceSelector" in peer:
            assert peer["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": "keda"}
            assert peer["podSelector"]["matchLabels"] == {"app": "keda-operator"}
        else:
            assert peer["podSelector"]["matchLabels"]["app.kubernetes.io/part-of"] == "vlmq"
    local = [p["podSelector"] for p in peers if "namespaceSelector" not in p]
    for comp in APPS:
        labels = deployment(objs, comp)["spec"]["template"]["metadata"]["labels"]
        assert any(selects(selector, labels) for selector in local), f"{comp} cannot reach Redis"


@pytest.mark.parametrize("build", EXTERNAL_REDIS_BUILDS)
def test_external_redis(build: str) -> None:
    """No Redis here; every pod takes the URL (with its password) from the Secret."""
    objs = render(build)
    assert not of_kind(objs, "StatefulSet") and not of_kind(objs, "NetworkPolicy")
    assert not [s for s in of_kind(objs, "Service") if component(s) == "redis"]
    for comp in APPS:
        entry = env_entries(main_container(deployment(objs, comp)))["VLMQ_REDIS_URL"]
        assert entry["valueFrom"]["secretKeyRef"] == {"name": SECRET, "key": "VLMQ_REDIS_URL"}


# --- cpu / gpu / model volume ---


@builds
def test_devices(build: str) -> None:
    objs = render(build)
    inference = main_container(deployment(objs, "inference"))
    device = settings(objs)["VLMQ_DEVICE"]
    gpus = [component(d) for d in of_kind(objs, "Deployment") if "nvidia.com/gpu" in str(main_container(d))]
    if build in GPU_BUILDS:
        assert device == "cuda"
        assert inference["resources"]["limits"]["nvidia.com/gpu"] == 1
        assert inference["image"] == "vlmq/vlmq:0.1.0-cuda"
        assert gpus == ["inference"], "only the inference worker takes a GPU"
    else:
        assert device == "cpu" and not gpus
        assert inference["image"] == "vlmq/vlmq:0.1.0"
    for dep in of_kind(objs, "Deployment"):
        if component(dep) != "inference":
            assert main_container(dep)["image"] == "vlmq/vlmq:0.1.0", "only inference needs CUDA"


@builds
def test_inference_identity_is_the_pod(build: str) -> None:
    env = env_entries(main_container(deployment(render(build), "inference")))
    assert env["VLMQ_WORKER_ID"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}


@builds
def test_model_is_where_every_reader_looks(build: str) -> None:
    """Gateway (result-cache key), both decodes (image processor), inference (weights) see the same
    checkpoint: bundled in the image, or mounted read-only at VLMQ_MODEL."""
    objs = render(build)
    model = str(setting_value(objs, CommonSettings, "model"))
    if not model.startswith("/"):
        return  # relative to the image's working directory: the bundled checkpoint
    for comp in ("gateway", *DECODES, "inference"):
        dep = deployment(objs, comp)
        mounts = [m for m in main_container(dep).get("volumeMounts", []) if m["mountPath"] == model]
        assert len(mounts) == 1 and mounts[0]["readOnly"] is True, f"{comp}: {model} not mounted read-only"
        volume = next(v for v in pod_spec(dep)["volumes"] if v["name"] == mounts[0]["name"])
        claim = volume["persistentVolumeClaim"]
        assert claim["readOnly"] is True
        named(objs, "PersistentVolumeClaim", claim["claimName"])


def test_overlays_differ_only_where_meant() -> None:
    """cpu and gpu render the same objects (names and kinds)."""

    def ids(build: str) -> set[tuple[str, str]]:
        return {(o["kind"], re.sub(r"-[a-z0-9]{10}$", "", o["metadata"]["name"])) for o in render(build)}

    assert ids("overlays/cpu") == ids("overlays/gpu")


def test_expansion_is_the_kubelets() -> None:
    assert expand("a $(X) $$(X) $(Y)", {"X": "1"}) == "a 1 $(X) $(Y)"
    assert var_refs("redis://:$(P)@h/0 $$(Q)") == ["P"]
