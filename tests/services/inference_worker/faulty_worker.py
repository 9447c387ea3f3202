"""``python -m tests.services.inference_worker.faulty_worker``: the real inference worker process, whose
model's forward raises while the file named by ``FAULTY_WORKER_FILE`` exists.

Test code only (production has no fault hook): it wraps ``Engine.from_pretrained`` and then runs the
worker's own ``main``, so the exit on an unhealthy engine is tested end to end, exit code included.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from services.engine import Engine, EngineConfig
from services.inference_worker.__main__ import main

FAULT_FILE = Path(os.environ["FAULTY_WORKER_FILE"])
_load = Engine.from_pretrained


def _with_fault(config: EngineConfig) -> Engine:
    engine = _load(config)

    def hook(*_: Any) -> None:
        if FAULT_FILE.exists():
            raise RuntimeError("injected forward fault")

    engine.model.get_decoder().layers[0].register_forward_pre_hook(hook)
    return engine


if __name__ == "__main__":
    Engine.from_pretrained = staticmethod(_with_fault)  # type: ignore[method-assign, assignment]
    sys.exit(main())
