"""Garbage collections by process from ``bench/gc_probe`` records: ``python -m bench.gc_report DIR
[--after S]`` (only collections later than S seconds into each process's life: after start-up)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def summary(record: dict[str, Any], after_s: float) -> str:
    events = [e for e in record["events"] if e[0] > after_s]
    by_gen = {g: [ms for _, gen, ms in events if gen == g] for g in (0, 1, 2)}
    counts = ", ".join(f"gen{g} {len(v)} ({sum(v):.1f} ms)" for g, v in by_gen.items())
    longest = max((ms for _, _, ms in events), default=0.0)
    name = " ".join(str(a) for a in record["argv"])[-60:]
    return f"{name:60s} {counts}; longest {longest:.1f} ms"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=Path)
    ap.add_argument("--after", type=float, default=25.0, help="seconds into each process's life")
    args = ap.parse_args()
    for path in sorted(args.folder.glob("*.json")):
        print(summary(json.loads(path.read_text()), args.after))


if __name__ == "__main__":
    main()
