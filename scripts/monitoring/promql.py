"""PromQL pieces the dashboard and the alerts share.

The gateway's ``/metrics`` shows two kinds of series: its own (this replica's requests: sum them
across replicas) and the cluster's, read from Redis (queues, workers, the workers' counters:
every replica shows the same, so ``cluster`` keeps one copy with ``max``).
"""

from __future__ import annotations

RATE = "$__rate_interval"  # Grafana's; the alerts use fixed windows


def cluster(expr: str) -> str:
    """One copy of a figure every gateway replica reports alike."""
    return f"max without (instance, pod) ({expr})"


def quantile(q: float, metric: str, by: str = "", window: str = RATE, own: bool = False) -> str:
    """The ``q`` quantile of histogram ``metric`` (name without ``_bucket``), by ``by`` labels.
    ``own``: a per-gateway histogram (summed across replicas rather than de-duplicated)."""
    rate = f"rate({metric}_bucket[{window}])"
    labels = ", ".join(["le", *([by] if by else [])])
    return f"histogram_quantile({q}, sum by ({labels}) ({rate if own else cluster(rate)}))"


def mean(metric: str, by: str = "", selector: str = "", window: str = RATE) -> str:
    """Mean observation of histogram ``metric`` over the window: rate of _sum over rate of _count."""
    group = f" by ({by})" if by else ""
    parts = [
        f"sum{group} ({cluster(f'rate({metric}_{part}{selector}[{window}])')})" for part in ("sum", "count")
    ]
    return f"{parts[0]} / {parts[1]}"


def ratio(hits: str, lookups: str, by: str = "", window: str = RATE, own: bool = False) -> str:
    """Hits over lookups (two counters) over the window."""
    group = f" by ({by})" if by else ""

    def rate(counter: str) -> str:
        inner = f"rate({counter}[{window}])"
        return f"sum{group} ({inner if own else cluster(inner)})"

    return f"{rate(hits)} / {rate(lookups)}"
