"""``Panel`` rows -> Grafana's dashboard JSON model."""

from __future__ import annotations

from typing import Any

from scripts.monitoring.dashboard import DATASOURCE, ROWS, Panel

WIDTH, HEIGHT = 12, 8  # two panels a row
WORKERS_QUERY = "label_values(vlmq_worker_info, worker)"


def dashboard() -> dict[str, Any]:
    panels: list[dict[str, Any]] = []
    y = 0
    for title, row in ROWS:
        panels.append(
            {"type": "row", "title": title, "collapsed": False, "panels": [], **_place(0, y, 24, 1)}
        )
        y += 1
        for i, panel in enumerate(row):
            panels.append(_timeseries(panel, (i % 2) * WIDTH, y + (i // 2) * HEIGHT))
        y += (len(row) + 1) // 2 * HEIGHT
    for number, placed in enumerate(panels, start=1):
        placed["id"] = number
    return {
        "uid": "vlmq-overview",
        "title": "vlmq",
        "description": "vlmq: jobs, latency, engine and gateway (README: Metrics)",
        "tags": ["vlmq"],
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "refresh": "30s",
        "time": {"from": "now-1h", "to": "now"},
        "timezone": "browser",
        "templating": {"list": [_datasource_variable(), _worker_variable()]},
        "annotations": {"list": []},
        "panels": panels,
    }


def _timeseries(panel: Panel, x: int, y: int) -> dict[str, Any]:
    return {
        "type": "timeseries",
        "title": panel.title,
        "description": panel.description,
        "datasource": DATASOURCE,
        "fieldConfig": {"defaults": {"unit": panel.unit}, "overrides": []},
        "options": {
            "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
            "tooltip": {"mode": "multi", "sort": "desc"},
        },
        "targets": [
            {"refId": chr(ord("A") + i), "datasource": DATASOURCE, "expr": expr, "legendFormat": legend}
            for i, (expr, legend) in enumerate(panel.targets)
        ],
        **_place(x, y, WIDTH, HEIGHT),
        **panel.extra,
    }


def _place(x: int, y: int, w: int, h: int) -> dict[str, Any]:
    return {"gridPos": {"x": x, "y": y, "w": w, "h": h}}


def _datasource_variable() -> dict[str, Any]:
    return {"name": "datasource", "label": "Prometheus", "type": "datasource", "query": "prometheus"}


def _worker_variable() -> dict[str, Any]:
    return {
        "name": "worker",
        "label": "Inference worker",
        "type": "query",
        "datasource": DATASOURCE,
        "query": {"query": WORKERS_QUERY, "refId": "workers"},
        "definition": WORKERS_QUERY,
        "refresh": 2,  # on time range change: workers come and go
        "includeAll": True,
        "multi": True,
        "allValue": ".*",
        "current": {"text": "All", "value": "$__all"},
        "sort": 1,
    }
