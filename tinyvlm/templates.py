"""Question phrasings per question type; the last phrasing of each list is held out of training.

Placeholders: ``{ref}``/``{other}`` are referring expressions ("the red circle"), ``{what}`` is
a plural noun phrase ("shapes", "red shapes", "circles").
"""

# type -> phrasings; TRAIN uses all but the last, the eval samples from all of them.
PHRASINGS: dict[str, tuple[str, ...]] = {
    "shape": (
        "What shape is {ref}?",
        "Which shape is {ref}?",
        "What kind of shape is {ref}?",
        "What is the shape of {ref}?",
        "Name the shape of {ref}.",
        "Tell me the shape of {ref}.",
    ),
    "colour": (
        "What colour is {ref}?",
        "What color is {ref}?",
        "Which colour is {ref}?",
        "What is the color of {ref}?",
        "Name the colour of {ref}.",
        "Tell me the color of {ref}.",
    ),
    "size": (
        "Is {ref} small or big?",
        "What size is {ref}?",
        "How big is {ref}?",
        "Is {ref} big or small?",
        "Which size is {ref}?",
        "Tell me the size of {ref}.",
    ),
    "position": (
        "Where is {ref}?",
        "Where is {ref} located?",
        "In which part of the picture is {ref}?",
        "Where can I find {ref}?",
        "What is the position of {ref}?",
        "Tell me where {ref} is.",
    ),
    "count": (
        "How many {what} are there?",
        "How many {what} are in the picture?",
        "Count the {what}.",
        "How many {what} do you see?",
        "What is the number of {what}?",
        "Tell me how many {what} there are.",
    ),
    "relative_h": (
        "Is {ref} left or right of {other}?",
        "Is {ref} to the left or to the right of {other}?",
        "Relative to {other}, is {ref} left or right?",
        "Which side of {other} is {ref} on, left or right?",
        "Is {ref} on the left or the right of {other}?",
        "Compared with {other}, is {ref} left or right?",
    ),
    "relative_v": (
        "Is {ref} above or below {other}?",
        "Is {ref} higher or lower than {other}, above or below?",
        "Relative to {other}, is {ref} above or below?",
        "Is {ref} over or under {other}, above or below?",
        "Is {ref} placed above or below {other}?",
        "Compared with {other}, is {ref} above or below?",
    ),
    "text": (
        "What is written in the picture?",
        "What does the text say?",
        "Which character is shown?",
        "What character is written in the image?",
        "Read the text in the picture.",
        "Tell me what is written.",
    ),
}

# Follow-up turns refer back to the previous turn's object ("it").
FOLLOW_UPS: dict[str, tuple[str, ...]] = {
    "shape": (
        "And its shape?",
        "What shape is it?",
        "And what shape is it?",
        "Which shape does it have?",
        "What kind of shape is it?",
        "Tell me its shape.",
    ),
    "colour": (
        "And its colour?",
        "And its color?",
        "What colour is it?",
        "What color does it have?",
        "Which colour is it?",
        "Tell me its colour.",
    ),
    "size": (
        "And its size?",
        "How big is it?",
        "Is it small or big?",
        "What size is it?",
        "Is it big or small?",
        "Tell me its size.",
    ),
    "position": (
        "And where is it?",
        "Where is it?",
        "Where is it located?",
        "And its position?",
        "In which part of the picture is it?",
        "Tell me where it is.",
    ),
}

# How an object's cell reads inside a referring expression ("the shape in the top left").
CELL_PHRASES: dict[str, str] = {
    "top left": "in the top left",
    "top": "at the top",
    "top right": "in the top right",
    "left": "on the left",
    "centre": "in the centre",
    "right": "on the right",
    "bottom left": "in the bottom left",
    "bottom": "at the bottom",
    "bottom right": "in the bottom right",
}


def phrasings(kind: str, follow_up: bool, held_out: bool) -> tuple[str, ...]:
    """Phrasings a split may use: training never sees the last one of each list."""
    table = FOLLOW_UPS if follow_up else PHRASINGS
    options = table[kind]
    return options if held_out else options[:-1]


def plural(shape: str) -> str:
    return shape + ("es" if shape.endswith("s") else "s")
