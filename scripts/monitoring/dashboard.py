"""The Grafana dashboard (``dashboard()``): jobs, latency, engine and gateway rows of time series.

Queries pick the Prometheus data source through the ``datasource`` variable and the inference
workers through ``worker``, so the same JSON works in any Grafana (Kubernetes sidecar, compose
provisioning, a manual import).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from scripts.monitoring.promql import RATE, cluster, mean, quantile, ratio

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
WORKER = 'worker=~"$worker"'
QUANTILES = ((0.5, "p50"), (0.9, "p90"), (0.99, "p99"))


@dataclass
class Panel:
    title: str
    unit: str
    targets: list[tuple[str, str]]  # (PromQL, legend)
    description: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def quantiles(metric: str) -> list[tuple[str, str]]:
    return [(quantile(q, metric), name) for q, name in QUANTILES]


def per_worker(expr: str, legend: str = "{{worker}}") -> tuple[str, str]:
    return f"sum by (worker) ({cluster(expr)})", legend


ROWS: list[tuple[str, list[Panel]]] = [
    (
        "Jobs",
        [
            Panel(
                "Jobs finished by outcome",
                "reqps",
                [(f"sum by (outcome) ({cluster(f'rate(vlmq_jobs_total[{RATE}])')})", "{{outcome}}")],
            ),
            Panel(
                "Jobs accepted by route",
                "reqps",
                [(f"sum by (route) (rate(vlmq_gateway_jobs_submitted_total[{RATE}]))", "{{route}}")],
            ),
            Panel(
                "Queues",
                "short",
                [
                    ("max by (queue) (vlmq_queue_depth)", "{{queue}}"),
                    ("sum(max by (stream) (vlmq_inference_backlog))", "inference backlog (unread)"),
                ],
                "Decode tasks waiting, inference jobs in flight, and the backlog KEDA scales on",
            ),
            Panel(
                "Inference workers",
                "short",
                [
                    ("max(vlmq_workers_alive)", "alive"),
                    per_worker(f"vlmq_worker_jobs_in_flight{{{WORKER}}}", "{{worker}} jobs"),
                    per_worker(f"vlmq_worker_healthy{{{WORKER}}}", "{{worker}} healthy"),
                ],
            ),
        ],
    ),
    (
        "Latency",
        [
            Panel("Time to first token", "s", quantiles("vlmq_time_to_first_token_seconds")),
            Panel("End-to-end latency", "s", quantiles("vlmq_e2e_request_latency_seconds")),
            Panel("Inter-token latency", "s", quantiles("vlmq_inter_token_latency_seconds")),
            Panel(
                "Queue time by stage (p90)",
                "s",
                [(quantile(0.9, "vlmq_request_queue_time_seconds", by="stage"), "{{stage}}")],
                "decode: accepted -> decode started; inference: tensor ready -> in a batch",
            ),
            Panel(
                "Stage times (mean)",
                "s",
                [
                    (mean("vlmq_request_image_decode_time_seconds"), "image decode"),
                    (mean("vlmq_request_vision_time_seconds"), "vision encoder"),
                    (mean("vlmq_request_prefill_time_seconds"), "prefill"),
                    (mean("vlmq_request_decode_time_seconds"), "token generation"),
                ],
            ),
            Panel(
                "Gateway submit time by route (p90)",
                "s",
                [(quantile(0.9, "vlmq_gateway_submit_seconds", by="route", own=True), "{{route}}")],
            ),
        ],
    ),
    (
        "Engine",
        [
            Panel(
                "Tokens per second",
                "short",
                [
                    per_worker(f"rate(vlmq_prompt_tokens_total{{{WORKER}}}[{RATE}])", "{{worker}} prompt"),
                    per_worker(
                        f"rate(vlmq_prompt_tokens_cached_total{{{WORKER}}}[{RATE}])", "{{worker}} cached"
                    ),
                    per_worker(
                        f"rate(vlmq_generation_tokens_total{{{WORKER}}}[{RATE}])", "{{worker}} generated"
                    ),
                ],
            ),
            Panel(
                "Batch size (mean sequences per step)",
                "short",
                [
                    (
                        mean("vlmq_engine_batch_size", by="worker", selector=f"{{{WORKER}}}"),
                        "{{worker}} decode",
                    ),
                    (
                        mean("vlmq_engine_prefill_batch_size", by="worker", selector=f"{{{WORKER}}}"),
                        "{{worker}} prefill",
                    ),
                ],
            ),
            Panel(
                "Engine thread CPU",
                "percentunit",
                [
                    per_worker(
                        f"rate(vlmq_engine_step_cpu_seconds_total{{{WORKER}}}[{RATE}])", "{{worker}} steps"
                    ),
                    per_worker(
                        f"rate(vlmq_engine_forward_cpu_seconds_total{{{WORKER}}}[{RATE}])",
                        "{{worker}} forwards",
                    ),
                    per_worker(
                        f"rate(vlmq_engine_prompt_cpu_seconds_total{{{WORKER}}}[{RATE}])",
                        "{{worker}} prompts",
                    ),
                ],
                "CPU seconds per second of the engine thread: whole steps, the model's forwards in them, "
                "and rendering submitted prompts (between steps)",
            ),
            Panel(
                "Sequences running and waiting",
                "short",
                [
                    per_worker(f"vlmq_num_requests_running{{{WORKER}}}", "{{worker}} running"),
                    per_worker(f"vlmq_num_requests_waiting{{{WORKER}}}", "{{worker}} waiting"),
                ],
            ),
            Panel(
                "Cache hit ratio",
                "percentunit",
                [
                    (ratio("vlmq_cache_hits_total", "vlmq_cache_lookups_total", by="cache"), "{{cache}}"),
                    (
                        ratio(
                            "vlmq_gateway_result_cache_hits_total",
                            "vlmq_gateway_result_cache_lookups_total",
                            own=True,
                        ),
                        "result (gateway)",
                    ),
                ],
            ),
            Panel(
                "Tokens per job (p50)",
                "short",
                [
                    (quantile(0.5, "vlmq_request_prompt_tokens"), "prompt"),
                    (quantile(0.5, "vlmq_request_generation_tokens"), "generated"),
                ],
            ),
            Panel(
                "Engine errors and refusals",
                "short",
                [
                    per_worker(
                        f"increase(vlmq_engine_errors_total{{{WORKER}}}[{RATE}])", "{{worker}} errors"
                    ),
                    per_worker(
                        f"increase(vlmq_engine_requests_rejected_total{{{WORKER}}}[{RATE}])",
                        "{{worker}} refused",
                    ),
                ],
            ),
        ],
    ),
    (
        "Gateway",
        [
            Panel(
                "Refused requests by status",
                "reqps",
                [
                    (f"sum by (status) (rate(vlmq_gateway_requests_rejected_total[{RATE}]))", "{{status}}"),
                    (f"sum(rate(vlmq_gateway_auth_failures_total[{RATE}]))", "bad or missing key"),
                ],
            ),
            Panel(
                "Open event streams",
                "short",
                [("sum by (kind) (vlmq_gateway_open_streams)", "{{kind}}")],
            ),
        ],
    ),
]
