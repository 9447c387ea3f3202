"""Per-image-token labels for the auxiliary training loss: what each image token shows.

The answers give one or two supervised tokens per question, a thin signal for teaching a vision
encoder from scratch. Every scene also says exactly what each image token shows, so training adds
a dense loss on the vision features the language model reads: colour, shape, size and grid cell of
the object whose centre falls in the token, or the glyph there. With vlmq-tiny's geometry
(``tinyvlm.build``: one token per grid cell) that is the whole content of the cell. The heads that
read these labels exist only during training; the saved model is a plain Glm4v.
"""

import torch

from tinyvlm import render, vocab
from tinyvlm.scene import Obj, Scene

# Label columns; 0 means "nothing" in every one of them.
COLUMNS = ("colour", "shape", "size", "cell", "glyph")
CLASSES = {
    "colour": 1 + len(vocab.COLOURS),
    "shape": 1 + len(vocab.SHAPES),
    "size": 1 + len(vocab.SIZES),
    "cell": 1 + len(vocab.CELL_NAMES),
    "glyph": 1 + len(vocab.GLYPHS),
}
KINDS = 3  # what a token shows: nothing, an object, the glyph
_COLOUR_IDS = {c: i + 1 for i, c in enumerate(vocab.COLOURS)}
_CELL_IDS = {cell: i + 1 for i, cell in enumerate(sorted(vocab.CELL_NAMES))}


def _token(x: float, y: float, scene: Scene, grid_h: int, grid_w: int) -> int:
    column = min(grid_w - 1, int(x / scene.width * grid_w))
    row = min(grid_h - 1, int(y / scene.height * grid_h))
    return row * grid_w + column


def object_token(obj: Obj, scene: Scene, grid_h: int, grid_w: int) -> int:
    """The image token (row-major) an object's centre falls in."""
    cx, cy, _ = render.object_geometry(obj, scene.width, scene.height)
    return _token(cx, cy, scene, grid_h, grid_w)


def glyph_token(scene: Scene, grid_h: int, grid_w: int) -> int:
    """The image token the glyph's centre falls in."""
    assert scene.glyph is not None
    left, top, right, bottom = render.glyph_box(scene.glyph, scene.width, scene.height, scene.font)
    return _token((left + right) / 2, (top + bottom) / 2, scene, grid_h, grid_w)


def token_labels(scene: Scene, grid_h: int, grid_w: int) -> torch.Tensor:
    """(grid_h*grid_w, len(COLUMNS)) int64 labels in the merged tokens' row-major order."""
    labels = torch.zeros(grid_h * grid_w, len(COLUMNS), dtype=torch.int64)
    for obj in scene.objects:
        token = object_token(obj, scene, grid_h, grid_w)
        assert labels[token].sum() == 0, "two objects in one image token"
        labels[token, :4] = torch.tensor(
            (
                _COLOUR_IDS[obj.colour],
                1 + vocab.SHAPES.index(obj.shape),
                1 + vocab.SIZES.index(obj.size),
                _CELL_IDS[obj.cell],
            )
        )
    if scene.glyph is not None:
        labels[glyph_token(scene, grid_h, grid_w), COLUMNS.index("glyph")] = 1 + vocab.GLYPHS.index(
            scene.glyph.char
        )
    return labels


def kinds(labels: torch.Tensor) -> torch.Tensor:
    """What each labelled token shows: 0 nothing, 1 an object, 2 the glyph."""
    is_object = (labels[:, COLUMNS.index("colour")] > 0).long()
    return torch.where(labels[:, COLUMNS.index("glyph")] > 0, 2, is_object)
