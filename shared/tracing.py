"""OpenTelemetry traces across the queue, off unless ``VLMQ_OTLP_ENDPOINT`` is set.

A job's trace: the gateway's request span (its parent the client's W3C ``traceparent``, or none:
a new trace) and, in it, ``vlmq.submit``, whose context is stored in the job (``JobSpec.traceparent``)
and so travels through Redis to the decode worker (``vlmq.queue.decode``, ``vlmq.decode``) and the
inference worker (``vlmq.inference`` with ``vlmq.queue.inference`` and the engine's stages). The
workers' spans are recorded when a stage ends, from its known start and end times, so nothing
is carried across threads or held open. Each process exports OTLP/HTTP (protobuf) to
``<VLMQ_OTLP_ENDPOINT>/v1/traces`` in batches (``OTEL_BSP_*`` tune them), as service ``vlmq-<process>``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from opentelemetry import context, trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

log = logging.getLogger(__name__)
TRACER = "vlmq"
_PROPAGATOR = TraceContextTextMapPropagator()
_enabled = False


def setup(process: str, endpoint: str | None) -> bool:
    """Install the exporting tracer provider (once per process, after any fork); False if off."""
    global _enabled
    if not endpoint or _enabled:
        return _enabled
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": f"vlmq-{process}"}))
    exporter = OTLPSpanExporter(endpoint=f"{endpoint.rstrip('/')}/v1/traces")
    provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    _enabled = True
    log.info("traces exported to %s as vlmq-%s", endpoint, process)
    return True


def enabled() -> bool:
    return _enabled


def tracer() -> trace.Tracer:
    return trace.get_tracer(TRACER)


def extract(headers: Mapping[str, str]) -> context.Context:
    """The context a W3C ``traceparent`` header names (an empty one when absent or invalid)."""
    return _PROPAGATOR.extract(dict(headers))


def current_traceparent() -> str | None:
    """The W3C ``traceparent`` of the current span, or None when no span records."""
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier)
    return carrier.get("traceparent")


@contextmanager
def span(
    name: str, kind: trace.SpanKind = trace.SpanKind.INTERNAL, **attributes: Any
) -> Iterator[trace.Span]:
    """A live span under the current one (a no-op one when tracing is off)."""
    with tracer().start_as_current_span(name, kind=kind, attributes=_clean(attributes)) as current:
        yield current


def record(
    name: str,
    traceparent: str | None,
    start: float,
    end: float,
    kind: trace.SpanKind = trace.SpanKind.INTERNAL,
    **attributes: Any,
) -> trace.Span | None:
    """A finished span from wall-clock ``start`` to ``end`` (seconds) under ``traceparent``
    (a span of this process, or a job's stored context); None when off or without a parent."""
    if not _enabled or not traceparent:
        return None
    parent = extract({"traceparent": traceparent})
    done = tracer().start_span(
        name, context=parent, kind=kind, start_time=_ns(start), attributes=_clean(attributes)
    )
    done.end(end_time=_ns(max(start, end)))
    return done


def traceparent_of(done: trace.Span | None) -> str | None:
    """The ``traceparent`` naming ``done`` as a parent."""
    if done is None:
        return None
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier, context=trace.set_span_in_context(done))
    return carrier.get("traceparent")


def _ns(seconds: float) -> int:
    return int(seconds * 1e9)


def _clean(attributes: dict[str, Any]) -> dict[str, Any]:
    return {f"vlmq.{k}": v for k, v in attributes.items() if v is not None}
