"""A second picture renderer, written apart from ``tinyvlm.render``: the eval's "pictures drawn by
someone else". A model trained only on render.py's pictures may have learnt that renderer's look
(its hard polygon edges, ink outlines, default font, gaussian noise) instead of the shapes, so the
eval also shows it the same scenes drawn another way. Nothing here comes from render.py, directly
or through another module (an import-linter contract and a test check it): shapes are rasterised
with numpy from signed distances at 4x supersampling and box-downsampled, outlined in a darker
shade of their own fill, lit from above, over a flat background with faint diagonal stripes and a
vignette, with uniform and salt-and-pepper noise and a serif glyph font. Only the geometry the scene
data states (cells, centres, radii, colours) is shared.
"""

import io
import math
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from tinyvlm.scene import Glyph, Obj, Scene

SUPERSAMPLE = 4
OUTLINE = 0.025  # outline width as a fraction of the smaller cell side (at least 1 px)
OUTLINE_SHADE = 0.6  # the outline is the fill colour times this
LIGHTING = 8.0  # grey levels lighter at the top of a shape, darker at the bottom
MAX_TILT = math.radians(8)
GLYPH_HEIGHT, GLYPH_MAX_WIDTH = 0.78, 0.95  # of the smaller cell side (a wide M is 0.68 tall)
FONT_PATH = Path(__file__).parent / "fonts" / "DejaVuSerif-Bold.ttf"


def _star_outline(inner: float = 0.45) -> np.ndarray:
    angles = -math.pi / 2 + np.arange(10) * math.pi / 5
    radii = np.where(np.arange(10) % 2 == 0, 1.0, inner)
    return np.stack([radii * np.cos(angles), radii * np.sin(angles)], axis=1)


def _plus_outline(half_arm: float = 0.2) -> np.ndarray:
    a, h = 0.98, half_arm
    quarter = [(h, -a), (h, -h), (a, -h)]  # one arm's corner, turned four times by 90 degrees
    return np.array(
        [(x * c - y * s, x * s + y * c) for c, s in ((1, 0), (0, 1), (-1, 0), (0, -1)) for x, y in quarter]
    )


# Shapes on a unit radius, y pointing down; every vertex within the unit circle, so a shape stays
# inside the circle of its radius (and so inside its cell) at any tilt.
OUTLINES: dict[str, np.ndarray] = {
    "square": np.array([(-0.7, -0.7), (0.7, -0.7), (0.7, 0.7), (-0.7, 0.7)]),
    "triangle": np.array([(0.0, -1.0), (0.866, 0.5), (-0.866, 0.5)]),
    "star": _star_outline(),
    "cross": _plus_outline(),
}


def _polygon_distance(x: np.ndarray, y: np.ndarray, vertices: np.ndarray) -> np.ndarray:
    """Signed distance to a closed polygon: negative inside (even-odd crossings decide the sign)."""
    best = np.full(x.shape, np.inf)
    inside = np.zeros(x.shape, dtype=bool)
    for (ax, ay), (bx, by) in zip(vertices, np.roll(vertices, -1, axis=0), strict=True):
        ex, ey, px, py = bx - ax, by - ay, x - ax, y - ay
        t = np.clip((px * ex + py * ey) / (ex * ex + ey * ey), 0.0, 1.0)
        best = np.minimum(best, np.hypot(px - t * ex, py - t * ey))
        crosses = (ay > y) != (by > y)
        with np.errstate(divide="ignore", invalid="ignore"):
            inside ^= crosses & (x < ax + (y - ay) * ex / np.where(ey == 0, 1, ey))
    return np.where(inside, -best, best)


def _shape_distance(shape: str, x: np.ndarray, y: np.ndarray, tilt: float) -> np.ndarray:
    """Signed distance in units of the radius, for points relative to the shape's centre."""
    if shape == "circle":
        return np.hypot(x, y) - 1.0
    c, s = math.cos(tilt), math.sin(tilt)
    return _polygon_distance(c * x + s * y, -s * x + c * y, OUTLINES[shape])


def _cell(cell: tuple[int, int], width: int, height: int) -> tuple[float, float, float]:
    cw, ch = width / 3, height / 3
    return (cell[0] + 0.5) * cw, (cell[1] + 0.5) * ch, min(cw, ch)


def _coverage(
    distance: Callable[[np.ndarray, np.ndarray], np.ndarray], xs: np.ndarray, ys: np.ndarray, outline: float
) -> tuple[np.ndarray, np.ndarray]:
    """How much of each pixel (centres xs, ys) the shape covers (outer) and its fill covers (inner),
    from SUPERSAMPLE x SUPERSAMPLE samples. A signed distance changes by at most 1 per pixel moved,
    so only pixels whose centre is within half a diagonal of an edge need the samples."""
    centre = distance(xs, ys)
    outer, inner = (centre < 0).astype(np.float32), (centre < -outline).astype(np.float32)
    edge = (np.abs(centre) < 0.75) | (np.abs(centre + outline) < 0.75)
    steps = (np.arange(SUPERSAMPLE) + 0.5) / SUPERSAMPLE - 0.5
    dx, dy = (offset.ravel() for offset in np.meshgrid(steps, steps))
    samples = distance(xs[edge][:, None] + dx, ys[edge][:, None] + dy)
    outer[edge], inner[edge] = (samples < 0).mean(axis=1), (samples < -outline).mean(axis=1)
    return outer[..., None], inner[..., None]


def _paint_object(pixels: np.ndarray, obj: Obj, tilt: float) -> None:
    height, width = pixels.shape[:2]
    x0, y0, side = _cell(obj.cell, width, height)
    cx, cy, r = x0 + obj.dx * side, y0 + obj.dy * side, obj.radius * side
    left, top = max(0, math.floor(cx - r) - 1), max(0, math.floor(cy - r) - 1)
    right, bottom = min(width, math.ceil(cx + r) + 2), min(height, math.ceil(cy + r) + 2)
    ys, xs = np.mgrid[top:bottom, left:right].astype(np.float32) + 0.5

    def distance(x: np.ndarray, y: np.ndarray) -> np.ndarray:  # in pixels
        return _shape_distance(obj.shape, (x - cx) / r, (y - cy) / r, tilt) * r

    outer, inner = _coverage(distance, xs, ys, max(1.0, OUTLINE * side))
    light = -LIGHTING * np.clip((ys - cy) / r, -1, 1)[..., None]
    fill = np.clip(np.asarray(obj.rgb, dtype=np.float32) + light, 0, 255)
    edge = np.asarray(obj.rgb, dtype=np.float32) * OUTLINE_SHADE
    region = pixels[top:bottom, left:right]
    pixels[top:bottom, left:right] = region * (1 - outer) + edge * (outer - inner) + fill * inner


@lru_cache(maxsize=64)
def _font(size: int) -> ImageFont.FreeTypeFont:
    return ImageFont.truetype(str(FONT_PATH), size)


def _ink(char: str, size: int) -> Image.Image:
    """The character's coverage, cropped to its ink (the font's boxes include side bearings)."""
    font = _font(size)
    left, top, right, bottom = (round(edge) for edge in font.getbbox(char))
    canvas = Image.new("L", (right - left + 4, bottom - top + 4))
    ImageDraw.Draw(canvas).text((2 - left, 2 - top), char, fill=255, font=font)
    return canvas.crop(canvas.getbbox())


def _glyph_mask(glyph: Glyph, width: int, height: int) -> tuple[np.ndarray, int, int]:
    """The glyph's coverage (0..1) and its top-left corner, ink centred on the cell."""
    cx, cy, side = _cell(glyph.cell, width, height)
    probe = _ink(glyph.char, 200)
    scale = min(GLYPH_HEIGHT * side / probe.height, GLYPH_MAX_WIDTH * side / probe.width)
    mask = _ink(glyph.char, max(6, round(200 * scale)))
    return np.asarray(mask, dtype=np.float32) / 255, round(cx - mask.width / 2), round(cy - mask.height / 2)


def _paint_glyph(pixels: np.ndarray, glyph: Glyph) -> None:
    height, width = pixels.shape[:2]
    mask, x, y = _glyph_mask(glyph, width, height)
    # Clip to the picture (a glyph on a tiny picture could reach a pixel past the edge).
    left, top = max(0, x), max(0, y)
    right, bottom = min(width, x + mask.shape[1]), min(height, y + mask.shape[0])
    alpha = mask[top - y : bottom - y, left - x : right - x][..., None]
    region = pixels[top:bottom, left:right]
    pixels[top:bottom, left:right] = region * (1 - alpha) + np.asarray(glyph.rgb) * alpha


def _background(scene: Scene) -> np.ndarray:
    """A flat colour, faint diagonal stripes and a vignette that pulls the corners towards grey."""
    ys, xs = np.mgrid[0 : scene.height, 0 : scene.width].astype(np.float32)
    period = max(4.0, min(scene.width, scene.height) / 60)
    stripes = 3.0 * np.sin(2 * math.pi * (xs + ys) / period)
    u, v = xs / scene.width - 0.5, ys / scene.height - 0.5
    toward_grey = np.sign(128 - np.asarray(scene.background, dtype=np.float32))
    vignette = 8.0 * (u * u + v * v) * 2  # 0 at the centre, 8 at the corners
    base = np.asarray(scene.background, dtype=np.float32) + stripes[..., None]
    return base + vignette[..., None] * toward_grey


def _add_noise(pixels: np.ndarray, level: float, rng: np.random.Generator) -> np.ndarray:
    """Uniform noise of the scene's sigma, plus sparse salt and pepper when there is any noise."""
    half = level * math.sqrt(3)  # a uniform [-h, h] has sigma h / sqrt(3)
    noisy = pixels + rng.uniform(-half, half, size=pixels.shape).astype(np.float32)
    if level > 0:
        speck = rng.random(pixels.shape[:2])
        noisy[speck < 0.0005] = 0
        noisy[speck > 0.9995] = 255
    return np.clip(np.rint(noisy), 0, 255).astype(np.uint8)


def draw(scene: Scene, seed: int) -> Image.Image:
    """The scene as an RGB image of its own size; ``seed`` picks tilts and noise."""
    # Separate streams: the noise stays the same whatever the number of objects.
    tilt_rng, noise_rng = (np.random.default_rng([seed, stream]) for stream in (0, 1))
    tilts = tilt_rng.uniform(-MAX_TILT, MAX_TILT, size=len(scene.objects))
    pixels = _background(scene)
    for obj, tilt in zip(scene.objects, tilts, strict=True):
        _paint_object(pixels, obj, float(tilt))
    if scene.glyph is not None:
        _paint_glyph(pixels, scene.glyph)
    return Image.fromarray(_add_noise(pixels, scene.noise, noise_rng))


def encode(image: Image.Image, scene: Scene) -> bytes:
    """The file bytes: JPEG at the scene's quality without chroma subsampling, or a PNG."""
    out = io.BytesIO()
    if scene.fmt == "jpeg":
        image.convert("RGB").save(out, format="JPEG", quality=scene.quality, subsampling=0)
    else:
        image.convert("RGB").save(out, format="PNG", compress_level=6)
    return out.getvalue()
