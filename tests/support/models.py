"""Which checkpoint the tests serve.

``models/vlmq-tiny`` (committed, trained) for everything that checks answers; the
random-init checkpoint in the same format for the inference-worker tests that want long,
predictable generations (it never emits EOS). The random one is built on first use
(``python -m tinyvlm.build --random``, a few seconds), so a fresh clone needs nothing else.
"""

from __future__ import annotations

import fcntl
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TRAINED = ROOT / "models" / "vlmq-tiny"
RANDOM_DEFAULT = ROOT / "runs" / "vlmq-tiny-random"


def trained_model_present() -> bool:
    return (TRAINED / "config.json").exists()


def random_model_path() -> Path:
    """The random-init checkpoint, built once (under a file lock: xdist/parallel safe)."""
    RANDOM_DEFAULT.parent.mkdir(parents=True, exist_ok=True)
    with open(RANDOM_DEFAULT.parent / ".random-model.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (RANDOM_DEFAULT / "model.safetensors").exists():
            cmd = [sys.executable, "-m", "tinyvlm.build", "--random", str(RANDOM_DEFAULT)]
            subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True)
    return RANDOM_DEFAULT


def test_model_path() -> Path:
    return TRAINED if trained_model_present() else random_model_path()
