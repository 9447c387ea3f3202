"""Draw a ``Scene`` at any pixel size, and encode it as the PNG/JPEG file a client would send."""

import io
import math
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from tinyvlm.scene import Glyph, Obj, Scene, ink

Point = tuple[float, float]
FONTS_DIR = Path(__file__).resolve().parent / "fonts"


def _regular(cx: float, cy: float, r: float, n: int, phase: float) -> list[Point]:
    return [
        (cx + r * math.cos(phase + 2 * math.pi * k / n), cy + r * math.sin(phase + 2 * math.pi * k / n))
        for k in range(n)
    ]


def _star(cx: float, cy: float, r: float, inner: float = 0.45) -> list[Point]:
    points = []
    for k in range(10):
        radius = r if k % 2 == 0 else r * inner
        angle = -math.pi / 2 + math.pi * k / 5
        points.append((cx + radius * math.cos(angle), cy + radius * math.sin(angle)))
    return points


def _cross(cx: float, cy: float, r: float, arm: float = 0.35) -> list[Point]:
    a, b = r, r * arm
    outline = [
        (-b, -a),
        (b, -a),
        (b, -b),
        (a, -b),
        (a, b),
        (b, b),
        (b, a),
        (-b, a),
        (-b, b),
        (-a, b),
        (-a, -b),
        (-b, -b),
    ]
    return [(cx + x, cy + y) for x, y in outline]


def _turned(points: list[Point], cx: float, cy: float, degrees: float) -> list[Point]:
    if not degrees:
        return points
    c, s = math.cos(math.radians(degrees)), math.sin(math.radians(degrees))
    return [(cx + c * (x - cx) - s * (y - cy), cy + s * (x - cx) + c * (y - cy)) for x, y in points]


def object_polygon(obj: Obj, cx: float, cy: float, r: float) -> list[Point]:
    """The outline of a non-circle object in its own proportions and turn (``Obj``'s drawing fields)."""
    r *= obj.extent
    if obj.shape == "star":
        points = _star(cx, cy, r * 1.1, obj.inner)
    elif obj.shape == "cross":
        points = _cross(cx, cy, r, obj.arm)
    else:
        points = polygon(obj.shape, cx, cy, r)
    return _turned(points, cx, cy, obj.angle)


def polygon(shape: str, cx: float, cy: float, r: float) -> list[Point]:
    if shape == "square":
        s = r * 0.85
        return [(cx - s, cy - s), (cx + s, cy - s), (cx + s, cy + s), (cx - s, cy + s)]
    if shape == "triangle":
        return _regular(cx, cy + r * 0.15, r * 1.1, 3, -math.pi / 2)
    if shape == "star":
        return _star(cx, cy, r * 1.1)
    if shape == "cross":
        return _cross(cx, cy, r)
    raise ValueError(f"unknown shape {shape!r}")


def _cell_box(cell: tuple[int, int], width: int, height: int) -> tuple[float, float, float]:
    """Cell centre (x, y) and the smaller cell side, in pixels."""
    cw, ch = width / 3, height / 3
    return (cell[0] + 0.5) * cw, (cell[1] + 0.5) * ch, min(cw, ch)


def object_geometry(obj: Obj, width: int, height: int) -> tuple[float, float, float]:
    """Centre (x, y) and radius of an object, in pixels of a ``width`` x ``height`` drawing."""
    x, y, side = _cell_box(obj.cell, width, height)
    return x + obj.dx * side, y + obj.dy * side, obj.radius * side


def _draw_object(draw: ImageDraw.ImageDraw, obj: Obj, scene: Scene, width: int, height: int) -> None:
    """The shape filled with its colour and outlined in ink. The outline gives every shape the same
    edge whatever its fill and background: without it, the vision tower's linear patch embedding
    had to learn each shape anew for every colour on every background (tinyvlm/README.md)."""
    cx, cy, r = object_geometry(obj, width, height)
    line = max(2, round(_cell_box(obj.cell, width, height)[2] * scene.outline_width))  # 2 px at least
    outline = _outline_colour(obj, scene)
    if outline is None:
        line = 0
    if obj.shape == "circle":
        r *= obj.extent
        draw.ellipse((cx - r, cy - r, cx + r, cy + r), fill=obj.rgb, outline=outline, width=line)
    else:
        draw.polygon(object_polygon(obj, cx, cy, r), fill=obj.rgb, outline=outline, width=line)


def _outline_colour(obj: Obj, scene: Scene) -> tuple[int, int, int] | None:
    if scene.outline == "none":
        return None
    if scene.outline == "shade":  # a darker shade of the fill
        r, g, b = (round(c * 0.55) for c in obj.rgb)
        return r, g, b
    return ink(scene.background)


@lru_cache(maxsize=256)
def _font(size: int, name: str = "default") -> ImageFont.FreeTypeFont | ImageFont.ImageFont:
    if name == "default":
        return ImageFont.load_default(size=size)
    return ImageFont.truetype(str(FONTS_DIR / f"{name}.ttf"), size=size)


def _glyph_font(glyph: Glyph, width: int, height: int, font: str = "default") -> tuple[float, float, Any]:
    x, y, side = _cell_box(glyph.cell, width, height)
    return x, y, _font(max(8, round(side * 0.8)), font)


def _glyph_matrix(glyph: Glyph) -> tuple[float, float, float, float]:
    """(a, b, c, d): the glyph's slant, width and turn as x' = a x + b y, y' = c x + d y about its
    anchor (y grows downwards, so a slant to the right shifts the top, y < 0, to larger x)."""
    cos, sin = math.cos(math.radians(glyph.angle)), math.sin(math.radians(glyph.angle))
    sx, sh = glyph.stretch, -glyph.shear
    return cos * sx, cos * sh - sin, sin * sx, sin * sh + cos


def _transformed(glyph: Glyph) -> bool:
    return (glyph.shear, glyph.stretch, glyph.angle) != (0.0, 1.0, 0.0)


def _draw_glyph(image: Image.Image, glyph: Glyph, width: int, height: int, font: str) -> None:
    x, y, face = _glyph_font(glyph, width, height, font)
    if not _transformed(glyph):
        ImageDraw.Draw(image).text((x, y), glyph.char, fill=glyph.rgb, font=face, anchor="mm")
        return
    # Drawn upright on a mask around the anchor, mapped through the matrix, pasted in its colour.
    half = round(getattr(face, "size", 16) * 1.5) + 2  # room for the slant and the turn
    side = 2 * half
    mask = Image.new("L", (side, side), 0)
    ImageDraw.Draw(mask).text((half, half), glyph.char, fill=255, font=face, anchor="mm")
    a, b, c, d = _glyph_matrix(glyph)
    det = a * d - b * c
    ia, ib, ic, id_ = d / det, -b / det, -c / det, a / det  # output pixel -> mask pixel
    coeffs = (ia, ib, half - ia * half - ib * half, ic, id_, half - ic * half - id_ * half)
    warped = mask.transform((side, side), Image.Transform.AFFINE, coeffs, resample=Image.Resampling.BILINEAR)
    origin = (round(x) - half, round(y) - half)
    image.paste(Image.new("RGB", (side, side), glyph.rgb), origin, warped)


def glyph_box(
    glyph: Glyph, width: int, height: int, font: str = "default"
) -> tuple[float, float, float, float]:
    """The glyph's ink bounding box (left, top, right, bottom) in pixels; for a slanted, stretched or
    turned glyph, the box of the upright box's corners mapped the same way."""
    x, y, face = _glyph_font(glyph, width, height, font)
    box = ImageDraw.Draw(Image.new("L", (1, 1))).textbbox((x, y), glyph.char, font=face, anchor="mm")
    if not _transformed(glyph):
        return box
    a, b, c, d = _glyph_matrix(glyph)
    corners = [(px - x, py - y) for px in (box[0], box[2]) for py in (box[1], box[3])]
    xs = [x + a * u + b * v for u, v in corners]
    ys = [y + c * u + d * v for u, v in corners]
    return min(xs), min(ys), max(xs), max(ys)


def _background(scene: Scene, width: int, height: int) -> np.ndarray:
    ys, xs = np.mgrid[0:height, 0:width].astype(np.float32)
    ramp = scene.gradient[0] * (xs / max(1, width - 1) - 0.5) + scene.gradient[1] * (
        ys / max(1, height - 1) - 0.5
    )
    ramp = ramp + _texture(scene, xs, ys, min(width, height))
    base = np.asarray(scene.background, dtype=np.float32)[None, None, :] + ramp[..., None]
    return np.clip(base, 0, 255)


def _texture(scene: Scene, xs: np.ndarray, ys: np.ndarray, side: int) -> np.ndarray | float:
    """A light pattern over the background, in grey levels (none for "plain")."""
    period = max(4.0, side / 24)
    if scene.texture == "stripes":
        return 7.0 * np.sign(np.sin((xs + ys) * math.pi / period))
    if scene.texture == "checks":
        return 6.0 * np.sign(np.sin(xs * math.pi / period) * np.sin(ys * math.pi / period))
    if scene.texture == "blotches":
        return 8.0 * np.sin(xs * 2.1 / period + 1.3) * np.sin(ys * 1.7 / period + 0.4)
    if scene.texture == "vignette":
        dx, dy = xs / max(1, xs.shape[1] - 1) - 0.5, ys / max(1, ys.shape[0] - 1) - 0.5
        return -40.0 * (dx * dx + dy * dy)
    return 0.0


def _draw_frame(draw: ImageDraw.ImageDraw, scene: Scene, width: int, height: int) -> None:
    if scene.frame is None:
        return
    line = max(1, round(min(width, height) * scene.frame_width))
    draw.rectangle((0, 0, width - 1, height - 1), outline=scene.frame, width=line)


def _add_noise(pixels: np.ndarray, sigma: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    noisy = pixels.astype(np.float32) + rng.normal(0.0, sigma, size=pixels.shape).astype(np.float32)
    return np.clip(noisy, 0, 255).astype(np.uint8)


def render(scene: Scene, scale: float = 1.0, seed: int = 0) -> Image.Image:
    """The scene as an RGB image of ``scale`` times its size.

    Noise sigma scales with ``scale``: resizing to the model's resolution averages noise down by
    the linear factor, so a rendering at half size with half the sigma looks the same after it.
    """
    width, height = max(1, round(scene.width * scale)), max(1, round(scene.height * scale))
    image = Image.fromarray(_background(scene, width, height).astype(np.uint8))
    draw = ImageDraw.Draw(image)
    _draw_frame(draw, scene, width, height)
    for obj in scene.objects:
        _draw_object(draw, obj, scene, width, height)
    if scene.glyph is not None:
        _draw_glyph(image, scene.glyph, width, height, scene.font)
    return Image.fromarray(_add_noise(np.asarray(image), scene.noise * scale, seed))


def encode(image: Image.Image, scene: Scene) -> bytes:
    """The file bytes (PNG or JPEG, as the scene says)."""
    buffer = io.BytesIO()
    if scene.fmt == "jpeg":
        image.save(buffer, format="JPEG", quality=scene.quality)
    else:
        image.save(buffer, format="PNG")
    return buffer.getvalue()


def round_trip(image: Image.Image, scene: Scene) -> Image.Image:
    """Encode and decode again, so training sees the same compression artefacts as clients send.
    PNG is lossless: its round trip would give the same pixels back, so it is skipped."""
    if scene.fmt == "png":
        return image
    return Image.open(io.BytesIO(encode(image, scene))).convert("RGB")
