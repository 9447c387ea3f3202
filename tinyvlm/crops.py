"""Single-object crops: a cheap first stage that teaches the vision tower shapes.

    python -m tinyvlm.probe --crop-steps 4000 --local-attention --steps 1200

A whole picture is 256 patches, and from scratch the tower does not learn, in the budget, to
gather one object's patches among them (shape stays near chance). A 56-px crop around one object
is 16 patches with one label for the crop, and there it learns shapes in minutes; with attention
that starts local, what it learns carries over to whole pictures (figures in ``tinyvlm/README.md``).
"""

import math
import random
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from tinyvlm import build, data, labels
from tinyvlm.schedule import fit

SIDE = 2 * build.MERGE  # crop side in patches: 2x2 image tokens, 56 px
TARGETS = ("shape", "colour", "size")  # label columns a crop is trained on
# Heads start looking one patch right, left, down or up (row, column offsets).
LOCAL_OFFSETS = ((0, 1), (0, -1), (1, 0), (-1, 0))


@dataclass
class Crop:
    values: torch.Tensor  # (SIDE*SIDE, patch features) as the processor would give them
    targets: torch.Tensor  # (len(TARGETS),) class ids counted from 0


def crops(example: data.Example, processor: Any) -> list[Crop]:
    """One crop per object whose centre lies in the picture: the 2x2 tokens around its centre token."""
    _, h, w = example.grid_thw.tolist()
    if h < SIDE or w < SIDE:
        return []
    grid, token_columns = data.picture_order(example.pixels, h, w), w // build.MERGE
    columns = [labels.COLUMNS.index(name) for name in TARGETS]
    out = []
    for token in (example.token_labels[:, labels.COLUMNS.index("centre")] == 1).nonzero().flatten().tolist():
        targets = example.token_labels[token, columns] - 1
        if (targets < 0).any():  # the object covers too little of its centre token, or the glyph does
            continue
        row, column = divmod(token, token_columns)
        top = min(max(row * build.MERGE - 1, 0), h - SIDE)  # the token centred, one patch around it
        left = min(max(column * build.MERGE - 1, 0), w - SIDE)
        patches = data.tower_order(grid[top : top + SIDE, left : left + SIDE])
        out.append(Crop(data.pixels_to_values(patches, processor), targets))
    return out


def local_attention(visual: Any, strength: float = 6.6) -> None:
    """Start each head looking at one neighbouring patch: constant query and key biases whose
    product, through the 2-D rotary embedding, peaks at the head's offset (W_q and W_k stay random
    and small, so attention is first positional and can learn content). ``strength`` 6.6 puts
    ~2 % of a head's attention on each patch next to its target."""
    dim, heads = visual.config.hidden_size, visual.config.num_heads
    head_dim, frequencies = dim // heads, visual.rotary_pos_emb.inv_freq
    visual.config.attention_bias = True
    with torch.no_grad():
        for block in visual.blocks:
            qkv = block.attn.qkv
            qkv.bias = nn.Parameter(torch.zeros(3 * dim))
            for head in range(heads):
                offsets = LOCAL_OFFSETS[head % len(LOCAL_OFFSETS)]
                for axis, offset in enumerate(offsets):
                    for f in range(3):  # the three fastest-turning frequencies of the axis
                        pair = head * head_dim + axis * frequencies.numel() + f
                        angle = float(frequencies[f]) * offset
                        qkv.bias[pair] = strength * math.cos(angle)
                        qkv.bias[pair + head_dim // 2] = strength * math.sin(angle)
                        qkv.bias[dim + pair] = strength  # the key: angle 0


class CropHeads(nn.Module):
    """Linear read-out of shape, colour and size from a crop's mean image token."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.sizes = [labels.CLASSES[name] - 1 for name in TARGETS]
        self.linear = nn.Linear(hidden, sum(self.sizes))

    def logits(self, visual: Any, batch: list[Crop]) -> tuple[torch.Tensor, ...]:
        grid = torch.tensor([[1, SIDE, SIDE]] * len(batch))
        tokens = visual(torch.cat([c.values for c in batch]), grid_thw=grid).pooler_output
        pooled = tokens.reshape(len(batch), -1, tokens.shape[-1]).mean(1)
        return torch.split(self.linear(F.layer_norm(pooled, pooled.shape[-1:])), self.sizes, dim=-1)


def accuracy(visual: Any, heads: CropHeads, held_out: list[Crop]) -> dict[str, float]:
    hits = [0] * len(TARGETS)
    with torch.no_grad():
        for start in range(0, len(held_out), 200):
            batch = held_out[start : start + 200]
            targets = torch.stack([c.targets for c in batch])
            for i, logits in enumerate(heads.logits(visual, batch)):
                hits[i] += int((logits.argmax(-1) == targets[:, i]).sum())
    total = max(1, len(held_out))
    return {f"crop {name}": round(100 * hit / total, 1) for name, hit in zip(TARGETS, hits, strict=True)}


def pretrain(
    visual: Any, train: list[Crop], held_out: list[Crop], steps: int, lr: float, batch: int = 64
) -> None:
    """Train the tower (in place) on crops, printing held-out crop accuracy each quarter."""
    heads = CropHeads(int(visual.config.out_hidden_size))
    rng, started = random.Random(0), time.time()

    def step_loss() -> torch.Tensor:
        rows = rng.sample(train, min(batch, len(train)))
        targets = torch.stack([c.targets for c in rows])
        logits = heads.logits(visual, rows)
        return torch.stack([F.cross_entropy(part, targets[:, i]) for i, part in enumerate(logits)]).sum()

    def report(step: int, loss: float) -> None:
        row = {"crop step": step, "loss": round(loss, 3), **accuracy(visual, heads, held_out)}
        print({**row, "seconds": round(time.time() - started)}, flush=True)

    fit([*visual.parameters(), *heads.parameters()], steps, lr, step_loss, report)
