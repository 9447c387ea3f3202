"""Every Redis key is built in shared/keys.py: prefixed and distinct; the decode queue is Celery's list."""

from __future__ import annotations

from shared.config import DecodeWorkerSettings
from shared.decode_task import DECODE_QUEUE, make_celery_app
from shared.keys import Keys


def test_every_key_carries_the_prefix_and_kinds_never_collide() -> None:
    keys = Keys("pfx")
    built = [
        keys.image("d"),
        keys.tensor("d", "p"),
        keys.job("x"),
        keys.job_events("x"),
        keys.job_wake("x"),
        keys.job_cancel("x"),
        keys.job_pixels("x"),
        keys.inference_stream(),
        keys.dead_letters(),
        keys.decode_queue(),
        keys.conversation("x"),
        keys.result_cache("h"),
        keys.worker_heartbeat("w"),
        keys.workers(),
        keys.active_jobs(),
        keys.sweeper_lock(),
        keys.metrics_counters(),
    ]
    assert all(k.startswith("pfx:") for k in built)
    assert len(set(built)) == len(built)


def test_decode_queue_is_the_list_celery_pushes_to() -> None:
    """KEDA and admission read LLEN of this key: it must be Celery's own queue list."""
    settings = DecodeWorkerSettings(_env_file=None, key_prefix="pfx")  # type: ignore[call-arg]
    app = make_celery_app(settings)
    prefix = app.conf.broker_transport_options["global_keyprefix"]
    assert f"{prefix}{DECODE_QUEUE}" == settings.keys.decode_queue()
    app.close()
