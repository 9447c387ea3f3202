"""Which checkpoint the tests serve: the trained one when present, else the random-init one."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TRAINED = ROOT / "models" / "vlmq-tiny"
READY_RANDOM = ROOT / "runs" / "READY-random.txt"
RANDOM_DEFAULT = ROOT / "runs" / "vlmq-tiny-random"


def trained_model_present() -> bool:
    return (TRAINED / "config.json").exists()


def random_model_path() -> Path:
    """Path named in runs/READY-random.txt (first existing directory mentioned), else the default."""
    if READY_RANDOM.exists():
        for word in READY_RANDOM.read_text().split():
            candidate = (ROOT / word.strip("`'\",.:;()")).resolve()
            if (candidate / "config.json").exists():
                return candidate
    return RANDOM_DEFAULT


def test_model_path() -> Path:
    return TRAINED if trained_model_present() else random_model_path()
