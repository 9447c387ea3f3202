"""Can an image encoder learn, in the training budget, what the answers need? A diagnostic.

    python -m tinyvlm.probe                       # the Glm4v vision tower, 400 steps
    python -m tinyvlm.probe --encoder cnn         # a small conv net on the same pixels and labels
    python -m tinyvlm.probe --encoder cnn-position-norm  # the conv net normalised per position
    python -m tinyvlm.probe --encoder patchify    # the same conv net behind a patch stem

Trains an encoder alone on the per-image-token labels (``tinyvlm.labels``) of the training data
and prints, every quarter of the run, the accuracy of a linear read-out per attribute on held-out
tokens that show something. The language model is left out: if the encoder cannot tell a star from
a circle, no amount of question answering on top of it will.

It is how the geometry was chosen (``tinyvlm/README.md``): on GLM-4V's default 14-px patches the
tower learnt colour, size and place but stayed near chance on shape, while a small conv net on the
same pixels read shapes at 99 %; with one image token per grid cell and outlined shapes the tower
reads them too.
"""

import argparse
import random
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from services.vlm.patch_embed import linear_patch_embed
from tinyvlm import build, data, labels, objective
from tinyvlm.schedule import fit

READ_OUT = ("colour", "shape", "size", "cell", "glyph")  # the attribute columns of labels.COLUMNS
CONV_WIDTH = 128  # channels of the conv net's last stages
HELD_OUT = 300  # examples kept out of training for the accuracy figures (at most a quarter)


def image_tensor(example: data.Example) -> torch.Tensor:
    """(3, H, W) floats in [0, 1]: the cached patches put back in picture order."""
    _, h, w = example.grid_thw.tolist()
    grid = data.picture_order(example.pixels, h, w)  # (h, w, 3, p, p)
    p = example.pixels.shape[-1]
    return grid.permute(2, 0, 3, 1, 4).reshape(3, h * p, w * p).float() / 255.0


class PositionNorm(nn.Module):
    """RMS norm over the channels at each position: what a ViT's pre-norm does to each token."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(channels, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(1, keepdim=True) + 1e-6) * self.weight


class ConvEncoder(nn.Module):
    """A small conv net mapping a picture to one feature vector per 28-px image token.

    ``patch`` > 1 puts a non-overlapping ``patch``-pixel stem first (what a ViT's patch embedding
    is); 1 starts with 3x3 kernels on the pixels, downsampled by max-pooling. ``norm`` "image"
    normalises each channel over one picture (a batch-norm of one image: pictures differ in size);
    "position" normalises each position over its channels, like a ViT's token norm."""

    def __init__(self, out: int, patch: int, norm: str = "image") -> None:
        super().__init__()

        def conv(c_in: int, c_out: int) -> list[nn.Module]:
            normaliser = nn.GroupNorm(c_out, c_out) if norm == "image" else PositionNorm(c_out)
            return [nn.Conv2d(c_in, c_out, 3, 1, 1), normaliser, nn.ReLU()]

        if patch > 1:
            width = CONV_WIDTH
            stem: list[nn.Module] = [nn.Conv2d(3, width, patch, patch), nn.GroupNorm(width, width), nn.ReLU()]
            stem += conv(width, width)
        else:
            stem = []
            for c_in, c_out in ((3, 16), (16, 32), (32, 64), (64, CONV_WIDTH)):
                stem += [*conv(c_in, c_out), nn.MaxPool2d(2)]
        self.stem = nn.Sequential(*stem)
        self.head = nn.Sequential(*conv(CONV_WIDTH, CONV_WIDTH), nn.Conv2d(CONV_WIDTH, out, 1))

    def patch_features(self, example: data.Example) -> torch.Tensor:
        """The features before the last convs: (CONV_WIDTH, H/16, W/16) for the pixel net."""
        return self.stem(image_tensor(example)[None])[0]

    def forward(self, batch: list[data.Example]) -> torch.Tensor:
        """(tokens of the whole batch, out), each picture's tokens row-major like the labels."""
        rows = []
        for example in batch:
            _, h, w = example.grid_thw.tolist()
            tokens = (h // build.MERGE, w // build.MERGE)
            grid = F.adaptive_avg_pool2d(self.head(self.patch_features(example)[None]), tokens)
            rows.append(grid[0].flatten(1).t())
        return torch.cat(rows)


class VisionTower(nn.Module):
    """vlmq-tiny's own (untrained) Glm4v vision tower, fed the cached patches like in training."""

    def __init__(self, processor: Any) -> None:
        super().__init__()
        model = build.build_model(processor.tokenizer)
        linear_patch_embed(model)
        self.visual = model.model.visual
        self.processor = processor

    def forward(self, batch: list[data.Example]) -> torch.Tensor:
        values = torch.cat([data.pixels_to_values(e.pixels, self.processor) for e in batch])
        out: Any = self.visual(values, grid_thw=torch.stack([e.grid_thw for e in batch]))
        return out.pooler_output


ENCODERS = ("vit", "cnn", "cnn-position-norm", "patchify")


def make_encoder(name: str, processor: Any, width: int) -> nn.Module:
    if name == "vit":
        return VisionTower(processor)
    if name == "patchify":
        return ConvEncoder(width, patch=build.PATCH)
    return ConvEncoder(width, patch=1, norm="position" if name == "cnn-position-norm" else "image")


def features(encoder: nn.Module, batch: list[data.Example]) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token features and labels of a batch, concatenated."""
    return encoder(batch), torch.cat([e.token_labels for e in batch])


@torch.no_grad()
def accuracy(
    encoder: nn.Module, heads: objective.TokenHeads, examples: list[data.Example]
) -> dict[str, float]:
    """Read-out accuracy per attribute (%) on the tokens where the attribute is present."""
    hits = dict.fromkeys(READ_OUT, 0)
    totals = dict.fromkeys(READ_OUT, 0)
    for start in range(0, len(examples), 50):
        feats, targets = features(encoder, examples[start : start + 50])
        logits = heads.logits(feats)
        for name in READ_OUT:
            column = labels.COLUMNS.index(name)
            present = targets[:, column] > 0
            hits[name] += int((logits[column][present].argmax(-1) == targets[present, column]).sum())
            totals[name] += int(present.sum())
    return {name: round(100 * hits[name] / max(1, totals[name]), 1) for name in READ_OUT}


def make_probe(encoder_name: str, processor: Any) -> tuple[nn.Module, objective.TokenHeads]:
    """A fresh encoder and its read-out heads."""
    torch.manual_seed(0)
    vision_config: Any = build.build_config(processor.tokenizer).vision_config
    width = int(vision_config.out_hidden_size)  # what the language model reads per image token
    return make_encoder(encoder_name, processor, width), objective.TokenHeads(width)


def split_held_out(examples: list[data.Example]) -> tuple[list[data.Example], list[data.Example]]:
    split = len(examples) - min(HELD_OUT, len(examples) // 4)
    return examples[:split], examples[split:]


def run(
    probe: tuple[nn.Module, objective.TokenHeads],
    steps: int,
    lr: float,
    examples: list[data.Example],
    batch: int = 16,
    extra_loss: nn.Module | None = None,
) -> list[dict[str, Any]]:
    """Train the encoder and the read-out heads (in place); one report per quarter of the run.

    ``extra_loss(batch, features)``, if given, is added to the label loss and trained along."""
    train, held_out = split_held_out(examples)
    encoder, heads = probe
    trained = [encoder, heads, *([extra_loss] if extra_loss else [])]
    params = [p for module in trained for p in module.parameters() if p.requires_grad]
    rng, started, reports = random.Random(0), time.time(), []

    def step_loss() -> torch.Tensor:
        rows = rng.sample(train, batch)
        feats, targets = features(encoder, rows)
        return heads.loss(feats, targets) + (extra_loss(rows, feats) if extra_loss else 0.0)

    def report(step: int, loss: float) -> None:
        encoder.eval()
        reports.append({"step": step, "loss": round(loss, 3), **accuracy(encoder, heads, held_out)})
        encoder.train()
        reports[-1]["seconds"] = round(time.time() - started)
        print(reports[-1], flush=True)

    fit(params, steps, lr, step_loss, report)
    return reports


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--encoder", choices=ENCODERS, default="vit")
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--examples", type=int, default=3300, help="training data (cached), incl. held out")
    parser.add_argument("--cache-dir", type=Path, default=Path("runs/cache"))
    args = parser.parse_args()
    torch.set_num_threads(2)
    processor = build.build_processor()
    examples = data.load_or_generate(args.examples, 1234, args.cache_dir)
    encoder, heads = make_probe(args.encoder, processor)
    run((encoder, heads), args.steps, args.lr, examples)


if __name__ == "__main__":
    main()
