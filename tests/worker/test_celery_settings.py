"""The decode workers' Celery settings as the app gets them (no worker runs here)."""

from __future__ import annotations

from shared.config import DecodeWorkerSettings
from worker.celery_app import make_app


def test_decode_pool_setting_reaches_celery() -> None:
    """The setting is the Celery app's ``worker_pool`` (the CLI's ``-P`` default)."""
    assert make_app(DecodeWorkerSettings(decode_pool="threads")).conf.worker_pool == "threads"
    assert make_app(DecodeWorkerSettings()).conf.worker_pool == "prefork"


def test_decode_tasks_skip_kombus_ack_emulation_unless_asked() -> None:
    """Off (default): no unacked hash, no visibility timeout (the sweeper recovers a dead node's jobs);
    on: kombu's emulation with the configured visibility timeout."""
    default = make_app(DecodeWorkerSettings()).conf.broker_transport_options
    assert default["ack_emulation"] is False and "visibility_timeout" not in default
    emulated = make_app(DecodeWorkerSettings(decode_ack_emulation=True, visibility_timeout_s=42))
    options = emulated.conf.broker_transport_options
    assert "ack_emulation" not in options and options["visibility_timeout"] == 42
