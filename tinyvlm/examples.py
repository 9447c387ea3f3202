"""The bundled example images (``examples/``) and the questions the tests and README ask about them.

python -m tinyvlm.examples     # (re)writes examples/*.png|jpg
"""

from pathlib import Path

from tinyvlm import render
from tinyvlm.scene import Glyph, Obj, Scene

EXAMPLES_DIR = Path(__file__).resolve().parent.parent / "examples"


def _obj(shape: str, colour: str, size: str, cell: tuple[int, int], rgb: tuple[int, int, int]) -> Obj:
    return Obj(shape, colour, size, cell, dx=0.0, dy=0.0, radius=0.42 if size == "big" else 0.25, rgb=rgb)


SCENES: dict[str, Scene] = {
    "shapes.png": Scene(
        width=480,
        height=320,
        background=(235, 235, 230),
        gradient=(10.0, -10.0),
        noise=0.0,
        objects=(
            _obj("circle", "red", "big", (0, 0), (220, 30, 30)),
            _obj("square", "blue", "small", (1, 1), (30, 70, 220)),
            _obj("triangle", "green", "big", (2, 2), (30, 170, 50)),
        ),
        glyph=None,
        fmt="png",
        quality=90,
    ),
    "sign.jpg": Scene(
        width=640,
        height=640,
        background=(40, 40, 45),
        gradient=(0.0, 15.0),
        noise=2.0,
        objects=(
            _obj("star", "yellow", "big", (0, 1), (240, 220, 20)),
            _obj("cross", "purple", "small", (2, 0), (140, 40, 180)),
        ),
        glyph=Glyph("7", (2, 2), (245, 245, 245)),
        fmt="jpeg",
        quality=90,
    ),
    "count.png": Scene(
        width=300,
        height=200,
        background=(210, 220, 230),
        gradient=(0.0, 0.0),
        noise=0.0,
        objects=(
            _obj("star", "orange", "big", (0, 0), (250, 140, 10)),
            _obj("star", "cyan", "small", (2, 0), (20, 210, 230)),
            _obj("cross", "pink", "big", (1, 2), (250, 120, 190)),
            _obj("circle", "orange", "small", (2, 1), (250, 140, 10)),
        ),
        glyph=None,
        fmt="png",
        quality=90,
    ),
}

# (image, conversation as [(question, expected answer), ...]); the first one is the README's.
QUESTIONS: list[tuple[str, list[tuple[str, str]]]] = [
    (
        "shapes.png",
        [("What colour is the circle?", "red"), ("And its size?", "big"), ("Where is it?", "top left")],
    ),
    ("shapes.png", [("What shape is the blue shape?", "square")]),
    ("shapes.png", [("How many shapes are there?", "3")]),
    ("sign.jpg", [("What is written in the picture?", "7")]),
    ("sign.jpg", [("What colour is the star?", "yellow"), ("Is it small or big?", "big")]),
    ("count.png", [("How many stars are there?", "2")]),
    ("count.png", [("Is the pink cross above or below the cyan star?", "below")]),
]


def write_examples(directory: Path = EXAMPLES_DIR) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for name, scene in SCENES.items():
        (directory / name).write_bytes(render.encode(render.render(scene, 1.0, seed=7), scene))


if __name__ == "__main__":
    write_examples()
