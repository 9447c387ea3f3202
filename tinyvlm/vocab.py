"""The closed world the tiny VLM talks about: attributes, answers and the default system prompt.

Everything here feeds the tokenizer's training corpus, so changing it after the
tokenizer is built only makes new words split into more byte-level pieces.
"""

# No hexagon: at the model's resolution a small one is a circle give or take a pixel (it was the
# vision tower's main confusion, with circles, in both directions). No diamond: small ones read as
# crosses (37 of 86 shape errors of the first whole model on held-out pictures).
SHAPES: tuple[str, ...] = ("circle", "square", "triangle", "star", "cross")
COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (220, 30, 30),
    "green": (30, 170, 50),
    "blue": (30, 70, 220),
    "yellow": (240, 220, 20),
    "orange": (250, 140, 10),
    "purple": (140, 40, 180),
    "pink": (250, 120, 190),
    "cyan": (20, 210, 230),
}
SIZES: tuple[str, ...] = ("small", "big")
# 3x3 grid cells, indexed (column, row), named as a person would describe them.
CELL_NAMES: dict[tuple[int, int], str] = {
    (0, 0): "top left",
    (1, 0): "top",
    (2, 0): "top right",
    (0, 1): "left",
    (1, 1): "centre",
    (2, 1): "right",
    (0, 2): "bottom left",
    (1, 2): "bottom",
    (2, 2): "bottom right",
}
RELATIONS: tuple[str, ...] = ("left", "right", "above", "below")
# Glyphs for rendered text: digits and letters that stay distinct at the model's resolution.
GLYPHS: tuple[str, ...] = tuple("0123456789") + tuple("ABEHKMRTXZ")
MAX_OBJECTS = 6

DEFAULT_SYSTEM_PROMPT = (
    "You are vlmq-tiny, a small vision assistant. You look at one picture of simple shapes "
    "drawn on a plain background and answer questions about it. Shapes can be a circle, square, "
    "triangle, star or cross, in eight colours, small or big, placed on a three "
    "by three grid. Some pictures also show one large digit or letter. Answer with one or two words "
    "or a number, with no full stop. If the user asks a follow-up "
    "question, it is about the same object as before. If a question is about anything else, "
    "answer I can't tell."
)
