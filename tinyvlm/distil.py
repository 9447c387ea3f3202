"""Does a teacher help the vision tower learn shapes? Distil the probe's conv net into it. A diagnostic.

    python -m tinyvlm.distil                      # conv net 800 steps, then the tower 400 steps

Trains the pixel conv net of ``tinyvlm.probe`` (which learns shapes and glyphs in minutes), then
trains the Glm4v vision tower on the same labels plus two feature-matching losses: its patch
features after block ``--block`` against the conv net's features at the same place in the picture,
and its image tokens against the conv net's. If the tower only lacked supervision, dense targets
from an encoder that already sees shapes would teach it; if it stays at chance, the tower itself is
what cannot learn them in the budget. It stays at chance (``tinyvlm/README.md``).
"""

import argparse
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from tinyvlm import build, data, probe


def tower_order(feature_map: torch.Tensor, grid_thw: torch.Tensor) -> torch.Tensor:
    """(C, h', w') map -> (h*w, C) rows in the tower's patch order, pooled to its patch grid."""
    _, h, w = grid_thw.tolist()
    grid = F.adaptive_avg_pool2d(feature_map[None], (h, w))[0]
    return data.tower_order(grid.permute(1, 2, 0))


def normed_mse(prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Squared error between layer-normed rows: the direction of the features, not their scale."""
    width = prediction.shape[-1:]
    return F.mse_loss(F.layer_norm(prediction, width), F.layer_norm(target, width))


class FeatureMatch(nn.Module):
    """Mean squared error between the tower's features and a frozen teacher's, both layer-normed."""

    def __init__(self, teacher: probe.ConvEncoder, tower: probe.VisionTower, block: int) -> None:
        super().__init__()
        self.teacher = teacher.requires_grad_(False).eval()
        hidden = int(tower.visual.config.hidden_size)
        self.project = nn.Linear(hidden, probe.CONV_WIDTH)  # tower width -> teacher channels
        self.patches: list[torch.Tensor] = []
        tower.visual.blocks[block].register_forward_hook(lambda _m, _i, out: self.patches.append(out))

    def forward(self, batch: list[data.Example], tokens: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            teacher_patches = [tower_order(self.teacher.patch_features(e), e.grid_thw) for e in batch]
            teacher_tokens = self.teacher(batch)
        patches = self.project(F.layer_norm(self.patches.pop(), (self.project.in_features,)))
        self.patches.clear()  # held-out forwards in between leave theirs here
        return normed_mse(patches, torch.cat(teacher_patches)) + normed_mse(tokens, teacher_tokens)


def distil(
    processor: Any, examples: list[data.Example], teacher_steps: int, steps: int, block: int
) -> list[dict[str, Any]]:
    """Train the teacher, then the tower with it; returns the tower's reports."""
    print(f"teacher: the pixel conv net, {teacher_steps} steps", flush=True)
    teacher, teacher_heads = probe.make_probe("cnn", processor)
    probe.run((teacher, teacher_heads), teacher_steps, 1e-3, examples)
    print(f"student: the Glm4v vision tower, {steps} steps, matching the teacher", flush=True)
    tower, heads = probe.make_probe("vit", processor)
    assert isinstance(teacher, probe.ConvEncoder) and isinstance(tower, probe.VisionTower)
    return probe.run((tower, heads), steps, 1e-3, examples, extra_loss=FeatureMatch(teacher, tower, block))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--teacher-steps", type=int, default=800)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--block", type=int, default=1, help="tower block matched to the teacher's patches")
    parser.add_argument("--examples", type=int, default=3300, help="training data (cached), incl. held out")
    parser.add_argument("--cache-dir", type=Path, default=Path("runs/cache"))
    args = parser.parse_args()
    torch.set_num_threads(2)
    examples = data.load_or_generate(args.examples, 1234, args.cache_dir)
    distil(build.build_processor(), examples, args.teacher_steps, args.steps, args.block)


if __name__ == "__main__":
    main()
