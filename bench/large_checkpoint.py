"""Write the engine bench's large random GLM-4V (``bench.common.build_large_glm``, ~91 M parameters)
as a checkpoint folder that the whole stack serves: ``python -m bench.large_checkpoint OUT [--small]``.

Then ``python -m bench.service_bench --model OUT`` measures the pipeline on a model whose forward is
not ~4 CPU-ms a request (bench/README.md). The folder holds the bundled model's tokenizer, chat
template and image processor beside the new weights. Random weights end answers at random tokens,
so answers compared with ``transformers serve`` may differ at near-ties (as ``bench.gpu_bench`` says).
``bench.gpu_bench.build_checkpoint`` is the GPU bench's own (a ~0.85B model whose answers never end
early); this one keeps the engine bench's model and the bundled processor as they are.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from bench.common import build_large_glm, bundled_model_path


def write_checkpoint(out: Path, small: bool = False, seed: int = 0) -> int:
    """The large (or, ``small``, the smoke-sized) random model in ``out``; its parameter count."""
    from transformers import AutoProcessor

    source = bundled_model_path()
    processor = AutoProcessor.from_pretrained(source)
    model = build_large_glm(processor, seed=seed, small=small)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    processor.save_pretrained(out)
    for name in ("chat_template.jinja", "tokenizer.json", "tokenizer_config.json"):
        if not (out / name).exists() and (source / name).exists():
            shutil.copy(source / name, out / name)
    return sum(p.numel() for p in model.parameters())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--small", action="store_true", help="the smoke-sized variant (2 layers of 256)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    params = write_checkpoint(args.out, args.small, args.seed)
    print(f"{args.out}: {params / 1e6:.1f} M parameters")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
