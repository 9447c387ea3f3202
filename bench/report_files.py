"""Where a benchmark's result goes: ``<out>/<bench>[_<mode>].json`` and ``.md``, the markdown
printed too (a smoke or quick run never overwrites a full run's files)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def write_report(out: Path, bench: str, mode: str, result: dict[str, Any], text: str) -> None:
    name = bench + ("" if mode == "full" else f"_{mode}")
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(result, indent=2))
    (out / f"{name}.md").write_text(text)
    print(text)
