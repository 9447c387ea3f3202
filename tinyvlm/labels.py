"""Per-image-token labels for the auxiliary training loss: what each merged image token shows.

The answers give one or two supervised tokens per question, a thin signal for teaching a vision
encoder from scratch. Every scene also says exactly what lies under each image token, so training
adds a dense loss on the vision features the language model reads: colour, shape, size and grid
cell of the object covering the token, the glyph over it, and whether an object's centre falls in it.
The heads that read these labels exist only during training; the saved model is a plain Glm4v.
"""

import numpy as np
import torch
from PIL import Image, ImageDraw

from tinyvlm import render, vocab
from tinyvlm.scene import Scene

# Label columns; 0 means "nothing" in every column but ``centre`` (0/1).
COLUMNS = ("colour", "shape", "size", "cell", "glyph", "centre")
CLASSES = {
    "colour": 1 + len(vocab.COLOURS),
    "shape": 1 + len(vocab.SHAPES),
    "size": 1 + len(vocab.SIZES),
    "cell": 1 + len(vocab.CELL_NAMES),
    "glyph": 1 + len(vocab.GLYPHS),
    "centre": 2,
}
SUB = 4  # label samples per token side
MIN_COVER = SUB * SUB // 4  # a token shows an object if it covers a quarter of it
GLYPH_INK = 255
_COLOUR_IDS = {c: i + 1 for i, c in enumerate(vocab.COLOURS)}
_CELL_IDS = {cell: i + 1 for i, cell in enumerate(sorted(vocab.CELL_NAMES))}


def _coverage_map(scene: Scene, grid_w: int, grid_h: int) -> np.ndarray:
    """(grid_h*SUB, grid_w*SUB) map: 1+object index where an object is drawn, GLYPH_INK under the glyph."""
    width, height = grid_w * SUB, grid_h * SUB
    sx, sy = width / scene.width, height / scene.height
    canvas = Image.new("L", (width, height), 0)
    draw = ImageDraw.Draw(canvas)
    for index, obj in enumerate(scene.objects):
        cx, cy, r = render.object_geometry(obj, scene.width, scene.height)
        if obj.shape == "circle":
            draw.ellipse((sx * (cx - r), sy * (cy - r), sx * (cx + r), sy * (cy + r)), fill=index + 1)
        else:
            draw.polygon([(sx * x, sy * y) for x, y in render.polygon(obj.shape, cx, cy, r)], fill=index + 1)
    if scene.glyph is not None:
        left, top, right, bottom = render.glyph_box(scene.glyph, scene.width, scene.height)
        draw.rectangle((sx * left, sy * top, sx * right, sy * bottom), fill=GLYPH_INK)
    return np.asarray(canvas)


def token_labels(scene: Scene, grid_h: int, grid_w: int) -> torch.Tensor:
    """(grid_h*grid_w, len(COLUMNS)) int64 labels in the merged tokens' row-major order."""
    blocks = _coverage_map(scene, grid_w, grid_h).reshape(grid_h, SUB, grid_w, SUB).transpose(0, 2, 1, 3)
    cover = blocks.reshape(grid_h * grid_w, SUB * SUB)
    labels = np.zeros((grid_h * grid_w, len(COLUMNS)), dtype=np.int64)
    for token, samples in enumerate(cover):
        values, counts = np.unique(samples[samples > 0], return_counts=True)
        if len(values) == 0 or counts.max() < MIN_COVER:
            continue
        value = int(values[counts.argmax()])
        if value == GLYPH_INK:
            assert scene.glyph is not None
            labels[token, 4] = 1 + vocab.GLYPHS.index(scene.glyph.char)
            continue
        obj = scene.objects[value - 1]
        labels[token, :4] = (
            _COLOUR_IDS[obj.colour],
            1 + vocab.SHAPES.index(obj.shape),
            1 + vocab.SIZES.index(obj.size),
            _CELL_IDS[obj.cell],
        )
    for obj in scene.objects:
        cx, cy, _ = render.object_geometry(obj, scene.width, scene.height)
        col = min(grid_w - 1, int(cx / scene.width * grid_w))
        row = min(grid_h - 1, int(cy / scene.height * grid_h))
        labels[row * grid_w + col, 5] = 1
    return torch.from_numpy(labels)
