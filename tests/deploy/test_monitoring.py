"""Monitoring beside the deployments: the Grafana dashboard, the alert rules (k8s/monitoring,
docker/monitoring), the scrape configs and KEDA's query use only metrics a live ``/metrics`` has,
each by a sample name its type gives (``_total`` of a counter, ``_bucket`` of a histogram...);
every expression parses as PromQL; the scrapes reach the gateway's metrics port."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import promql_parser
import yaml
from prometheus_client.parser import text_string_to_metric_families

from scripts.monitoring.__main__ import main as monitoring_main
from scripts.monitoring.alerts import rule_groups
from tests.deploy.manifests import (
    K8S,
    deployment,
    keda_triggers,
    main_container,
    render,
    selects,
    settings,
)
from tests.support.stack import ServiceStack

ROOT = K8S.parent
DASHBOARD = K8S / "monitoring" / "vlmq-dashboard.json"
RULE_FILES = (K8S / "monitoring" / "prometheusrule.yaml", ROOT / "docker" / "monitoring" / "alerts.yml")
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$__interval": "1m", "$worker": ".*"}
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}


def test_generated_files_are_up_to_date() -> None:
    assert monitoring_main(["--check"]) == 0, "python -m scripts.monitoring"


def test_every_metric_used_exists_in_a_live_metrics(service_stack: ServiceStack) -> None:
    samples = sample_names(httpx.get(f"{service_stack.base_url}/metrics", timeout=30).text)
    used: dict[str, set[str]] = {}
    for where, expr in expressions():
        for name in metric_names(expr):
            used.setdefault(name, set()).add(where)
    vlmq = {name: where for name, where in used.items() if name.startswith("vlmq_")}
    assert {"vlmq_inference_backlog", "vlmq_time_to_first_token_seconds_bucket"} <= set(vlmq)
    unknown = {name: sorted(where) for name, where in vlmq.items() if name not in samples}
    assert not unknown, f"not in /metrics (or not by its type's sample name): {unknown}"
    assert set(used) == set(vlmq), f"only vlmq metrics: {set(used) - set(vlmq)}"


def test_a_misspelt_or_mistyped_metric_is_caught(service_stack: ServiceStack) -> None:
    samples = sample_names(httpx.get(f"{service_stack.base_url}/metrics", timeout=30).text)
    assert "vlmq_jobs_total" in samples and "vlmq_time_to_first_token_seconds_bucket" in samples
    assert "vlmq_jobs" not in samples  # a counter is read by its _total
    assert "vlmq_time_to_first_token_seconds" not in samples  # a histogram by its series
    assert metric_names('sum(rate(vlmq_x_total{a="b"}[5m])) / on() group_left vlmq_y') == {
        "vlmq_x_total",
        "vlmq_y",
    }


def test_rule_files_agree_and_name_their_alerts() -> None:
    k8s_rule, compose_rules = (yaml.safe_load(path.read_text()) for path in RULE_FILES)
    assert k8s_rule["kind"] == "PrometheusRule" and k8s_rule["spec"]["groups"] == compose_rules["groups"]
    rules = [rule for group in rule_groups() for rule in group["rules"]]
    assert len({rule["alert"] for rule in rules}) == len(rules)
    for rule in rules:
        assert rule["labels"]["severity"] in ("critical", "warning") and rule["annotations"]["summary"]
        assert re.fullmatch(r"\d+[smh]", rule["for"]), rule


def test_podmonitor_scrapes_the_gateways_metrics_port() -> None:
    (monitor,) = [o for o in render("monitoring") if o["kind"] == "PodMonitor"]
    for build in ("overlays/cpu", "overlays/gpu"):
        objs = render(build)
        gateway = deployment(objs, "gateway")
        assert selects(monitor["spec"]["selector"], gateway["spec"]["template"]["metadata"]["labels"])
        container = main_container(gateway)
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
        assert ports[endpoint["port"]] == int(settings(objs)["VLMQ_METRICS_PORT"])
        assert endpoint["path"] == "/metrics"


def test_compose_prometheus_scrapes_the_gateway_and_loads_the_rules() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    config = yaml.safe_load((ROOT / "docker" / "monitoring" / "prometheus.yml").read_text())
    (job,) = config["scrape_configs"]
    (target,) = [t for static in job["static_configs"] for t in static["targets"]]
    assert target == f"gateway:{services['gateway']['environment']['VLMQ_METRICS_PORT']}"
    mounts = dict(volume.split(":")[:2] for volume in services["prometheus"]["volumes"] if ":/" in volume)
    assert mounts["./docker/monitoring/alerts.yml"] in config["rule_files"]
    grafana = dict(volume.split(":")[:2] for volume in services["grafana"]["volumes"])
    provider = yaml.safe_load(
        (ROOT / "docker" / "monitoring" / "grafana" / "dashboards" / "vlmq.yml").read_text()
    )
    dashboard_at = Path(grafana[f"./{DASHBOARD.relative_to(ROOT)}"])
    assert str(dashboard_at.parent) == provider["providers"][0]["options"]["path"]
    assert grafana["./docker/monitoring/grafana"] == "/etc/grafana/provisioning"


def expressions() -> Iterator[tuple[str, str]]:
    """(where, PromQL) of every query: dashboard panels and variables, alert rules, KEDA."""
    board = json.loads(DASHBOARD.read_text())
    for panel in board["panels"]:
        for target in panel.get("targets", []):
            yield f"panel {panel['title']!r}", grafana_free(target["expr"])
    for variable in board["templating"]["list"]:
        if variable["type"] == "query":
            inner = re.fullmatch(r"label_values\((.+),\s*\w+\)", variable["definition"])
            assert inner, variable["definition"]
            yield f"variable {variable['name']}", inner.group(1)
    for path in RULE_FILES:
        document = yaml.safe_load(path.read_text())
        for group in document.get("spec", document)["groups"]:
            for rule in group["rules"]:
                yield f"{path.name} {rule['alert']}", rule["expr"]
    for build in ("overlays/cpu", "overlays/gpu"):
        objs = render(build)
        for trigger in keda_triggers(objs, deployment(objs, "inference")["metadata"]["name"]):
            if trigger["type"] == "prometheus":
                yield f"{build} KEDA", trigger["metadata"]["query"]


def grafana_free(expr: str) -> str:
    for variable, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(variable, value)
    assert "$" not in expr, expr
    return expr


def metric_names(expr: str) -> set[str]:
    """Metric names of every selector in ``expr`` (which must parse)."""
    names: set[str] = set()

    def visit(node: Any) -> None:
        if isinstance(node, promql_parser.VectorSelector) and node.name:
            names.add(node.name)

    promql_parser.walk(promql_parser.parse(expr), visit)
    return names


def sample_names(text: str) -> set[str]:
    """Sample names each family's type gives it, whether or not it has samples yet."""
    names: set[str] = set()
    for family in text_string_to_metric_families(text):
        names.update(f"{family.name}{suffix}" for suffix in SUFFIXES.get(family.type, ("",)))
    return names
