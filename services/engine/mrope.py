"""M-RoPE positions of a whole prompt in a few tensor operations.

``get_rope_index`` (GLM-4V, Qwen2-VL) groups the prompt's token types in Python and builds every run
with small tensor ops: ~0.13 ms of the inference worker's main thread a request on the bundled model.
The rule it applies to still images is short: a text run counts on from the current position on all
three axes; an image run gives (t, h, w) grid positions offset by the current position, which then
advances by the image's largest merged side. ``Architecture`` uses this only where a probe at load
gives ``get_rope_index``'s positions exactly, and falls back to it for a prompt this does not cover.
"""

from __future__ import annotations

import functools

import torch


def grid_positions(
    ids: list[int], grids: list[list[int]], image_token_id: int, merge: int
) -> torch.Tensor | None:
    """(3, N) positions of ``ids`` whose image-token runs are the images of ``grids`` ((t, h, w) each,
    in order), or None where the runs and the grids do not match one to one, or a grid has more
    than one frame."""
    n = len(ids)
    out = torch.empty(3, n, dtype=torch.long)
    position = cursor = 0  # the next position; where the text before the next image starts
    for t, h, w in grids:
        if t != 1:
            return None  # several frames: the families' rules differ there (and no probe covers it)
        try:
            start = ids.index(image_token_id, cursor)
        except ValueError:
            return None  # fewer image runs than grids
        end = start + t * (h // merge) * (w // merge)
        if ids[start:end].count(image_token_id) != end - start or (end < n and ids[end] == image_token_id):
            return None  # a run of another size (or two images' tokens side by side): not this rule
        out[:, cursor:start] = torch.arange(position, position + start - cursor)
        position += start - cursor
        out[:, start:end] = _image_positions(t, h // merge, w // merge, position)
        position += max(h, w) // merge
        cursor = end
    if image_token_id in ids[cursor:]:
        return None  # more image runs than grids
    out[:, cursor:] = torch.arange(position, position + n - cursor)
    return out


def _image_positions(t: int, h: int, w: int, offset: int) -> torch.Tensor:
    return _grid_block(t, h, w) + offset


@functools.lru_cache(maxsize=64)
def _grid_block(t: int, h: int, w: int) -> torch.Tensor:
    """(3, t*h*w) positions of one image's tokens from 0, made once per grid (a dozen small ops:
    most of a prompt's positions' cost). Read only: every caller adds its offset into a new tensor."""
    temporal = torch.arange(t).view(t, 1, 1).expand(t, h, w)
    rows = torch.arange(h).view(1, h, 1).expand(t, h, w)
    cols = torch.arange(w).view(1, 1, w).expand(t, h, w)
    return torch.stack([temporal, rows, cols]).reshape(3, -1)
