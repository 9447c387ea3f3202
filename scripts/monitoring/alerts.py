"""The alert rules, as one Prometheus rule group (``rule_groups``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from scripts.monitoring.promql import cluster, quantile


@dataclass(frozen=True)
class Alert:
    name: str
    expr: str
    for_: str
    severity: str  # critical: someone acts now; warning: look today
    summary: str

    def rule(self) -> dict[str, Any]:
        return {
            "alert": self.name,
            "expr": self.expr,
            "for": self.for_,
            "labels": {"severity": self.severity},
            "annotations": {"summary": self.summary},
        }


FAILED_RATE = 'rate(vlmq_jobs_total{outcome="failed"}[10m])'
DEAD_LETTERED = 'increase(vlmq_sweeper_actions_total{action="dead_lettered"}[1h])'

ALERTS = [
    Alert(
        "VlmqMetricsAbsent",
        "absent(vlmq_workers_alive)",
        "5m",
        "critical",
        "Prometheus scrapes no vlmq gateway (its metrics listener, VLMQ_METRICS_PORT)",
    ),
    Alert(
        "VlmqNoInferenceWorker",
        "max(vlmq_workers_alive) < 1",
        "2m",
        "critical",
        "No inference worker has a fresh heartbeat: jobs wait and /readyz fails",
    ),
    Alert(
        "VlmqWorkerUnhealthy",
        "max by (worker) (vlmq_worker_healthy) == 0",
        "2m",
        "warning",
        "Inference worker {{ $labels.worker }} reports unhealthy (it exits to be restarted)",
    ),
    Alert(
        "VlmqInferenceBacklog",
        "sum(max by (stream) (vlmq_inference_backlog)) > 16",
        "10m",
        "warning",
        "{{ $value }} jobs wait for an inference worker: add workers (KEDA scales on this figure)",
    ),
    Alert(
        "VlmqDecodeBacklog",
        'max by (queue) (vlmq_queue_depth{queue=~"decode.*"}) > 32',
        "10m",
        "warning",
        "{{ $value }} decode tasks wait in {{ $labels.queue }}: add decode workers",
    ),
    Alert(
        "VlmqSlowTimeToFirstToken",
        f"{quantile(0.9, 'vlmq_time_to_first_token_seconds', window='5m')} > 10",
        "10m",
        "warning",
        "90 % of jobs wait up to {{ $value | humanizeDuration }} for their first token",
    ),
    Alert(
        "VlmqJobsFailing",
        f"sum({cluster(FAILED_RATE)}) / sum({cluster('rate(vlmq_jobs_total[10m])')}) > 0.05",
        "10m",
        "warning",
        "{{ $value | humanizePercentage }} of finished jobs failed",
    ),
    Alert(
        "VlmqEngineErrors",
        f"sum by (worker) ({cluster('increase(vlmq_engine_errors_total[10m])')}) > 0",
        "0m",
        "warning",
        "The engine of {{ $labels.worker }} raised in a step (its sequences failed)",
    ),
    Alert(
        "VlmqDeadLetters",
        f"sum({cluster(DEAD_LETTERED)}) > 0",
        "0m",
        "warning",
        "Jobs failed for good after too many deliveries: GET /v1/dead-letters",
    ),
    Alert(
        "VlmqGatewayServerErrors",
        'sum(rate(vlmq_gateway_requests_rejected_total{status=~"5.."}[5m])) > 0.1',
        "10m",
        "warning",
        "The gateways answer {{ $value }} server errors per second (503: queue or Redis unavailable)",
    ),
]


def rule_groups() -> list[dict[str, Any]]:
    return [{"name": "vlmq", "rules": [alert.rule() for alert in ALERTS]}]
