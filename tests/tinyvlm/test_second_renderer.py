"""The second renderer: objects and glyph where the scene puts them, in their colours, on a faint
background, a look of its own, and no code shared with render.py."""

import ast
import io
import math
import random
from dataclasses import replace
from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tinyvlm import render, second_renderer, vocab
from tinyvlm.scene import BIG_RADIUS, WIDE_SPEC, Glyph, Obj, Scene, sample_scene

SIZES = ((96, 130), (250, 400), (1024, 1000))


def _scene(width: int, height: int, objects: tuple[Obj, ...] = (), glyph: Glyph | None = None) -> Scene:
    return Scene(width, height, (235, 228, 205), (0.0, 0.0), 0.0, objects, glyph, "png", 90)


def _obj(shape: str, cell: tuple[int, int], corner: tuple[int, int] = (1, 1), colour: str = "blue") -> Obj:
    """The biggest object the scene sampler makes, pushed as far towards ``corner`` as it may go."""
    radius = BIG_RADIUS[1]
    slack = (0.5 - radius) * 0.5
    dx, dy = ((c - 1) * slack for c in corner)
    return Obj(shape, colour, "big", cell, dx, dy, radius, vocab.COLOURS[colour])


@lru_cache(maxsize=8)
def _drawn(scene: Scene, seed: int) -> np.ndarray:
    return np.asarray(second_renderer.draw(scene, seed), dtype=np.int16)


def _changed(scene: Scene, seed: int = 0) -> np.ndarray:
    """Where the picture differs from the same picture with nothing on it (same texture and noise)."""
    empty = _drawn(replace(scene, objects=(), glyph=None), seed)
    return np.abs(_drawn(scene, seed) - empty).max(axis=2) > 0


def _assert_inside_cell(changed: np.ndarray, cell: tuple[int, int]) -> None:
    height, width = changed.shape
    ys, xs = np.nonzero(changed)
    assert xs.size > 0, "nothing was drawn"
    cw, ch = width / 3, height / 3  # pixels the cell touches, partly covered edge pixels included
    assert math.floor(cell[0] * cw) <= xs.min() and xs.max() < math.ceil((cell[0] + 1) * cw)
    assert math.floor(cell[1] * ch) <= ys.min() and ys.max() < math.ceil((cell[1] + 1) * ch)


@pytest.mark.parametrize("shape", vocab.SHAPES)
def test_every_shape_stays_in_its_cell(shape: str) -> None:
    for (width, height), cell, corner in zip(
        SIZES, ((0, 0), (2, 1), (1, 2)), ((0, 0), (2, 2), (2, 0)), strict=True
    ):
        for seed in range(3):  # different tilts
            scene = _scene(width, height, (_obj(shape, cell, corner),))
            _assert_inside_cell(_changed(scene, seed), cell)


def test_glyph_centred_in_its_cell_and_about_four_fifths_tall() -> None:
    for width, height in SIZES:
        side = min(width, height) / 3
        for char in vocab.GLYPHS:
            changed = _changed(_scene(width, height, glyph=Glyph(char, (2, 2), (15, 15, 15))))
            _assert_inside_cell(changed, (2, 2))
            ys, xs = np.nonzero(changed)
            assert 0.65 * side <= ys.max() + 1 - ys.min() <= 0.87 * side, char
            assert abs((ys.min() + ys.max() + 1) / 2 - 2.5 * height / 3) <= 1.5, char
            assert abs((xs.min() + xs.max() + 1) / 2 - 2.5 * width / 3) <= 1.5, char


def test_colour_at_the_object_centre_is_its_rgb() -> None:
    for shape in vocab.SHAPES:
        for colour in vocab.COLOURS:
            obj = _obj(shape, (1, 1), corner=(0, 2), colour=colour)
            scene = replace(_scene(300, 240, (obj,)), noise=6.0)
            pixels = np.asarray(second_renderer.draw(scene, seed=1), dtype=np.float32)
            side = min(300, 240) / 3
            cx, cy = round(1.5 * 100 + obj.dx * side), round(1.5 * 80 + obj.dy * side)
            centre = pixels[cy - 1 : cy + 2, cx - 1 : cx + 2].reshape(-1, 3)
            centre = np.median(centre, axis=0)  # a speck of salt or pepper may land there
            assert np.abs(centre - np.asarray(obj.rgb)).max() <= 10, (shape, colour, centre)


def test_background_texture_is_faint() -> None:
    for width, height in SIZES:
        pixels = np.asarray(second_renderer.draw(_scene(width, height), seed=0), dtype=np.int16)
        assert (pixels.max(axis=(0, 1)) - pixels.min(axis=(0, 1))).max() <= 15


def test_same_seed_same_picture_of_the_scene_size() -> None:
    scene = sample_scene(random.Random(4), WIDE_SPEC)
    a, b = second_renderer.draw(scene, 7), second_renderer.draw(scene, 7)
    assert a.mode == "RGB" and a.size == (scene.width, scene.height)
    assert a.tobytes() == b.tobytes()
    assert a.tobytes() != second_renderer.draw(scene, 8).tobytes()


def test_looks_different_from_render_py() -> None:
    rng = random.Random(9)
    for seed in range(8):
        scene = sample_scene(rng)
        ours = np.asarray(second_renderer.draw(scene, seed), dtype=np.int16)
        theirs = np.asarray(render.render(scene, seed=seed), dtype=np.int16)
        differ = np.abs(ours - theirs).max(axis=2) > 40  # outlines, glyph, shape proportions
        assert ours.shape == theirs.shape
        assert differ.mean() > 0.01, seed


@pytest.mark.parametrize("fmt", ["png", "jpeg"])
def test_encode_round_trips(fmt: str) -> None:
    scene = replace(sample_scene(random.Random(5)), fmt=fmt, quality=85)
    image = second_renderer.draw(scene, 3)
    data = second_renderer.encode(image, scene)
    assert data.startswith(b"\x89PNG" if fmt == "png" else b"\xff\xd8\xff")
    back = Image.open(io.BytesIO(data)).convert("RGB")
    assert back.size == image.size
    error = np.abs(np.asarray(back, dtype=np.int16) - np.asarray(image, dtype=np.int16)).mean()
    assert error == 0 if fmt == "png" else error < 6


def _tinyvlm_imports(path: Path) -> set[str]:
    imported: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            imported |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module)  # `from tinyvlm import x` may name a module x
            imported |= {f"{node.module}.{alias.name}" for alias in node.names}
    return {name for name in imported if name.split(".")[0] == "tinyvlm"}


def test_second_renderer_shares_no_code_with_render_py() -> None:
    """Everything it imports from tinyvlm, followed through, is the scene data and the colour table."""
    package = Path(second_renderer.__file__).parent
    seen, todo = set(), [Path(second_renderer.__file__)]
    while todo:
        for name in _tinyvlm_imports(todo.pop()):
            module = package / (name.removeprefix("tinyvlm.").replace(".", "/") + ".py")
            if name not in seen and module.exists():
                seen.add(name)
                todo.append(module)
    assert "tinyvlm.render" not in seen
    assert seen <= {"tinyvlm.scene", "tinyvlm.vocab"}, seen
