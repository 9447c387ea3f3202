"""The learning-rate schedule of every tinyvlm training loop, and the diagnostics' optimiser loop.

Its own module so that ``tinyvlm.train`` and the diagnostic ``tinyvlm.probe``
share it without importing each other.
"""

import math
from collections.abc import Callable

import torch


def lr_at(step: int, peak: float, steps: int, warmup: int) -> float:
    """Linear warm-up, then cosine down to 10 % of the peak."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def fit(
    params: list[torch.nn.Parameter],
    steps: int,
    lr: float,
    step_loss: Callable[[], torch.Tensor],
    each_quarter: Callable[[int, float], None],
) -> None:
    """The diagnostics' optimiser: AdamW with the recipe's warm-up and cosine, gradients clipped at
    1. ``step_loss()`` is one step's loss; ``each_quarter(step, loss)`` runs after every quarter of
    the steps and after the last."""
    optimizer = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=0.01)
    for step in range(steps):
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, lr, steps, warmup=30)
        loss = step_loss()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if (step + 1) % max(1, steps // 4) == 0 or step == steps - 1:
            each_quarter(step + 1, loss.item())
