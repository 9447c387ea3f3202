"""Every process of the running stack froze its startup heap (``shared.heap``) before serving."""

from __future__ import annotations

from tests.support.stack import ServiceStack


def test_every_stack_process_froze_its_startup_heap(service_stack: ServiceStack) -> None:
    logs = {name: proc.log() for name, proc in service_stack.procs.items()}
    assert "inference worker:" in logs["inference"] and "startup objects frozen" in logs["inference"]
    assert "gateway:" in logs["gateway"] and "startup objects frozen" in logs["gateway"]
    for process in ("decode process:", "decode main process:"):  # the pool's child, and its parent
        assert process in logs["decode"], logs["decode"][-3000:]
