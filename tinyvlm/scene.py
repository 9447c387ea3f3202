"""Seeded scene sampling: image size, background, objects on a 3x3 grid, an optional glyph.

A scene is pure data (normalised geometry); ``tinyvlm.render`` draws it at any pixel size, so
the same scene can be drawn full size for the eval and smaller for training.
"""

import math
import random
from dataclasses import dataclass, replace

from tinyvlm import vocab

Cell = tuple[int, int]

# Object radii as fractions of the smaller cell side, and how far an object's centre may stray from
# its cell's centre (a share of the room left in the cell). Every object stays inside its cell.
SMALL_RADIUS = (0.24, 0.29)
BIG_RADIUS = (0.38, 0.46)
CENTRE_SLACK = 0.5
LIGHT_BACKGROUNDS = ((245, 245, 240), (225, 225, 225), (235, 228, 205), (210, 220, 230), (200, 200, 190))
DARK_BACKGROUNDS = ((40, 40, 45), (25, 28, 32), (70, 70, 70), (55, 45, 40))


@dataclass(frozen=True)
class Obj:
    shape: str
    colour: str
    size: str
    cell: Cell
    # Centre offset inside the cell and radius, as fractions of the smaller cell side.
    dx: float
    dy: float
    radius: float
    rgb: tuple[int, int, int]
    # How this one is drawn (``SceneSpec.augment``; defaults: render.py's fixed proportions): its
    # extent as a share of the radius, a turn in degrees, a cross's arm half-width and a star's inner
    # radius, as shares of the radius.
    extent: float = 1.0
    angle: float = 0.0
    arm: float = 0.35
    inner: float = 0.45


@dataclass(frozen=True)
class Glyph:
    char: str
    cell: Cell
    rgb: tuple[int, int, int]
    # Slant (x shift per unit of height, positive leans right), width factor and turn in degrees
    # (``SceneSpec.augment``; defaults: upright, as the font draws it).
    shear: float = 0.0
    stretch: float = 1.0
    angle: float = 0.0


@dataclass(frozen=True)
class Scene:
    width: int
    height: int
    background: tuple[int, int, int]
    gradient: tuple[float, float]  # brightness ramp along x and y, in grey levels
    noise: float  # gaussian noise sigma at full size, in grey levels
    objects: tuple[Obj, ...]
    glyph: Glyph | None
    fmt: str  # "png" or "jpeg"
    quality: int  # JPEG quality
    # How the picture is drawn, beyond what it shows (``SceneSpec.variety``; defaults: the first look).
    texture: str = "plain"  # see TEXTURES
    frame: tuple[int, int, int] | None = None  # a border in this colour
    frame_width: float = 0.0  # as a share of the picture's smaller side
    outline: str = "ink"  # see OUTLINES
    outline_width: float = 0.04  # as a share of the smaller cell side
    font: str = "default"  # the glyph's font, see FONTS


@dataclass(frozen=True)
class SceneSpec:
    """A distribution of scenes; the eval's wide set uses a different one within trained ranges."""

    object_weights: tuple[float, ...] = (3, 3, 3, 2.5, 2, 1.5)  # for 1..6 objects
    glyph_prob: float = 0.35
    max_aspect: float = 2.0
    extreme_sizes: bool = False  # sides drawn near 96 or near 1024
    # Curriculum only: objects drawn this many times larger (can spill out of their cell), so an
    # untrained model first finds them without searching the picture.
    radius_scale: float = 1.0
    only_attribute: str | None = None  # curriculum only: ask just this attribute of one object
    # Chance that an object copies the colour or the shape of an earlier one: counts of 2 and 3 of a
    # colour or shape are rare in the uniform draw (training's polish stage only).
    repeat: float = 0.0
    # Training's polish stage only: extra turns on what the model gets wrong most (attributes asked
    # through "the shape left of ..." references, counts of one colour or shape).
    drills: bool = False
    # Pictures as people draw them: objects anywhere in their cell, wider aspect ratios, textures,
    # frames, colour shades, outline styles, several glyph fonts, any JPEG quality. Off, scenes are
    # drawn exactly as for the first model (the held-out set stays the same pictures).
    variety: bool = False
    # Training only, on top of ``variety``: offsets with mass at the cell's edges, each object drawn
    # in its own proportions and turn, slanted, narrow and turned glyphs, and a share of pictures in
    # the first look (tinyvlm/notes/2026-12-04-missed-rows.md). Off, no extra draws are made.
    augment: bool = False
    # Training conversations only: the weight of "I can't tell" questions among fresh ones (None:
    # ``dialogue.TRAINING``'s). Fewer of them, fewer false refusals to unseen wordings.
    unknown_weight: float | None = None


LEGACY_SPEC = SceneSpec()
VARIED_SPEC = SceneSpec(variety=True)  # the eval's pictures of the training look
TRAIN_SPEC = SceneSpec(variety=True, augment=True)
WIDE_SPEC = SceneSpec(object_weights=(0, 0, 0, 1, 2, 3), glyph_prob=0.6, extreme_sizes=True)
TEXTURES = ("plain", "stripes", "checks", "blotches", "vignette")
OUTLINES = ("ink", "none", "shade")
# Glyph fonts in training ("default": Pillow's own); tinyvlm/fonts holds the files.
FONTS = ("default", "DejaVuSans-Bold", "DejaVuSans", "DejaVuSansMono", "DejaVuSerif")
HELD_OUT_FONT = "DejaVuSansCondensed-Oblique"  # the eval's other-font row; never in training
VARIETY_SLACK = 0.9  # an object's centre may stray this share of the room left in its cell
VARIETY_ASPECT = 2.2
LEGACY_SHARE = 0.25  # augmented training: pictures drawn in the first look (its shapes read best)
EDGE_SHARE = 0.5  # augmented training: offsets drawn near the edge of the room, per axis


def _side(rng: random.Random, spec: SceneSpec) -> int:
    if spec.extreme_sizes:
        return rng.randint(96, 140) if rng.random() < 0.5 else rng.randint(850, 1024)
    return round(math.exp(rng.uniform(math.log(96), math.log(1024))))


def sample_size(rng: random.Random, spec: SceneSpec) -> tuple[int, int]:
    """Width and height in [96, 1024] with aspect ratio at most ``spec.max_aspect``."""
    max_aspect = VARIETY_ASPECT if spec.variety else spec.max_aspect
    while True:
        width, height = _side(rng, spec), _side(rng, spec)
        if max(width, height) / min(width, height) <= max_aspect:
            return width, height


def _jitter(rgb: tuple[int, int, int], rng: random.Random, amount: int) -> tuple[int, int, int]:
    r, g, b = (min(255, max(0, c + rng.randint(-amount, amount))) for c in rgb)
    return r, g, b


def ink(background: tuple[int, int, int]) -> tuple[int, int, int]:
    """The colour of the glyph and of every shape's outline: near white on dark backgrounds, near
    black on light ones."""
    return (245, 245, 245) if sum(background) < 384 else (15, 15, 15)


def _object(rng: random.Random, cell: Cell, spec: SceneSpec) -> Obj:
    size = rng.choice(vocab.SIZES)
    radius = rng.uniform(*(BIG_RADIUS if size == "big" else SMALL_RADIUS)) * spec.radius_scale
    slack = max(0.0, 0.5 - radius) * (VARIETY_SLACK if spec.variety else CENTRE_SLACK)
    colour = rng.choice(list(vocab.COLOURS))
    obj = Obj(
        shape=rng.choice(vocab.SHAPES),
        colour=colour,
        size=size,
        cell=cell,
        dx=rng.uniform(-slack, slack),
        dy=rng.uniform(-slack, slack),
        radius=radius,
        rgb=_shade(vocab.COLOURS[colour], rng) if spec.variety else _jitter(vocab.COLOURS[colour], rng, 12),
    )
    return _augmented(obj, slack, rng) if spec.augment else obj


def _edge_offset(slack: float, rng: random.Random) -> float:
    """Uniform half the time, else near the edge of the room: a uniform draw leaves an object in a
    corner of its cell (both offsets near the edge) about 1 % of the time, too rare to be learnt."""
    if rng.random() < EDGE_SHARE:
        return rng.uniform(-slack, slack)
    return rng.choice((-1, 1)) * rng.uniform(0.75, 1.0) * slack


def _augmented(obj: Obj, slack: float, rng: random.Random) -> Obj:
    """Offsets with mass at the edges and the object's own drawing proportions. The extent range
    keeps the size classes apart (small at most 0.29 x 1.05, big at least 0.38 x 0.88)."""
    return replace(
        obj,
        dx=_edge_offset(slack, rng),
        dy=_edge_offset(slack, rng),
        extent=rng.uniform(0.88, 1.05),
        angle=rng.uniform(-10.0, 10.0),
        arm=rng.uniform(0.2, 0.4),
        inner=rng.uniform(0.38, 0.5),
    )


def _augmented_glyph(glyph: Glyph, rng: random.Random) -> Glyph:
    """Slanted, narrow or wide, and turned: training's fonts are all upright and of normal width."""
    return replace(
        glyph, shear=rng.uniform(-0.3, 0.3), stretch=rng.uniform(0.7, 1.15), angle=rng.uniform(-6.0, 6.0)
    )


def _shade(rgb: tuple[int, int, int], rng: random.Random) -> tuple[int, int, int]:
    """A lighter or darker shade of a colour, jittered: still read as the same colour name."""
    factor = rng.uniform(0.82, 1.1)
    shaded = tuple(min(255, round(c * factor)) for c in rgb)
    return _jitter((shaded[0], shaded[1], shaded[2]), rng, 18)


def _looks(rng: random.Random, background: tuple[int, int, int]) -> dict:
    """The drawing style of a varied scene (Scene's texture, frame, outline and font fields)."""
    frame = None
    if rng.random() < 0.3:
        frame = rng.choice([(15, 15, 15), (245, 245, 245), (120, 120, 120), *vocab.COLOURS.values()])
    return {
        "texture": rng.choice(TEXTURES),
        "frame": frame,
        "frame_width": rng.uniform(0.01, 0.05),
        "outline": rng.choices(OUTLINES, weights=(2, 1, 1))[0],
        "outline_width": rng.uniform(0.02, 0.07),
        "font": rng.choice(FONTS),
        "quality": rng.randint(25, 95),
    }


def _repeat_attributes(objects: list[Obj], rng: random.Random, chance: float) -> list[Obj]:
    out: list[Obj] = []
    for obj in objects:
        if out and rng.random() < chance:
            model = rng.choice(out)
            if rng.random() < 0.5:
                obj = replace(obj, colour=model.colour, rgb=_jitter(vocab.COLOURS[model.colour], rng, 12))
            else:
                obj = replace(obj, shape=model.shape)
        out.append(obj)
    return out


def sample_scene(rng: random.Random, spec: SceneSpec = TRAIN_SPEC) -> Scene:
    if spec.augment and rng.random() < LEGACY_SHARE:
        spec = replace(spec, variety=False, augment=False)
    width, height = sample_size(rng, spec)
    n = rng.choices(range(1, vocab.MAX_OBJECTS + 1), weights=spec.object_weights)[0]
    has_glyph = rng.random() < spec.glyph_prob
    cells = rng.sample(sorted(vocab.CELL_NAMES), n + int(has_glyph))
    dark = rng.random() < 0.35
    background = _jitter(rng.choice(DARK_BACKGROUNDS if dark else LIGHT_BACKGROUNDS), rng, 10)
    glyph = None
    if has_glyph:
        glyph = Glyph(char=rng.choice(vocab.GLYPHS), cell=cells[-1], rgb=ink(background))
        if spec.augment:
            glyph = _augmented_glyph(glyph, rng)
    fmt = rng.choice(("png", "jpeg"))
    gradient, noise = (rng.uniform(-25, 25), rng.uniform(-25, 25)), rng.uniform(2.0, 10.0)
    objects = [_object(rng, cell, spec) for cell in cells[:n]]
    if spec.repeat:  # no extra draws otherwise: the other specs' scenes stay as they were
        objects = _repeat_attributes(objects, rng, spec.repeat)
    scene = Scene(
        width=width,
        height=height,
        background=background,
        gradient=gradient,
        noise=noise,
        objects=tuple(objects),
        glyph=glyph,
        fmt=fmt,
        quality=rng.randint(70, 95),
    )
    return replace(scene, **_looks(rng, background)) if spec.variety else scene
