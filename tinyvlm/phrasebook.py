"""The paraphrase grammar's tables: question cores per type, the frames around them, and the words
that vary inside references. ``tinyvlm.grammar`` composes them.

A question is a frame around a core. Cores come in three forms, so one frame fits every type:

- ``A``: a direct question without its mark ("what colour is {ref}");
- ``B``: a noun phrase ("the colour of {ref}"), for "What is {B}?", "Tell me {B}.";
- ``C``: an embedded clause ("what colour {ref} is"), for "Can you tell me {C}?".

A *family* is one frame or one core. Families listed in ``HELD_OUT_FRAMES`` and ``HELD_OUT_CORES``
never appear in training (nor in the tokenizer's corpus): the eval's held-out-family row asks only
through them, so it measures whether the model reads the content words, not memorised templates.
"""

# Placeholders: {ref}/{other} referring expressions ("the red circle"), {what} a plural noun phrase
# ("red shapes"), {obj} an indefinite one ("a red circle").
CORES: dict[str, dict[str, tuple[str, ...]]] = {
    "colour": {
        "A": (
            "what colour is {ref}",
            "what color is {ref}",
            "which colour is {ref}",
            "which color is {ref}",
            "what colour does {ref} have",
            "what color is {ref} painted",
            "what's the colour of {ref}",
        ),
        "B": ("the colour of {ref}", "the color of {ref}", "the colour {ref} has"),
        "C": ("what colour {ref} is", "what color {ref} is", "which colour {ref} has"),
    },
    "shape": {
        "A": (
            "what shape is {ref}",
            "which shape is {ref}",
            "what kind of shape is {ref}",
            "what shape does {ref} have",
            "what sort of shape is {ref}",
            "what's the shape of {ref}",
        ),
        "B": ("the shape of {ref}", "the kind of shape {ref} is", "the form of {ref}"),
        "C": ("what shape {ref} is", "what kind of shape {ref} is", "which shape {ref} has"),
    },
    "size": {
        "A": (
            "is {ref} small or big",
            "is {ref} big or small",
            "what size is {ref}",
            "how big is {ref}",
            "how large is {ref}",
            "is {ref} large or small",
            "which size is {ref}",
        ),
        "B": ("the size of {ref}", "the size {ref} has"),
        "C": ("how big {ref} is", "how large {ref} is", "what size {ref} is", "if {ref} is small or big"),
    },
    "position": {
        "A": (
            "where is {ref}",
            "where is {ref} located",
            "in which part of the picture is {ref}",
            "where can I find {ref}",
            "where's {ref}",
            "in which cell is {ref}",
            "where is {ref} placed",
        ),
        "B": ("the position of {ref}", "the location of {ref}", "the place of {ref}"),
        "C": ("where {ref} is", "where {ref} is located", "in which part of the picture {ref} is"),
    },
    "count": {
        "A": (
            "how many {what} are there",
            "how many {what} are in the picture",
            "how many {what} do you see",
            "how many {what} can you see",
            "how many {what} are in the image",
            "how many {what} does the picture have",
        ),
        "B": ("the number of {what}", "the count of {what}", "the number of {what} in the picture"),
        "C": ("how many {what} there are", "how many {what} you see", "how many {what} are in the picture"),
    },
    "relative_h": {
        "A": (
            "is {ref} left or right of {other}",
            "is {ref} to the left or to the right of {other}",
            "is {ref} on the left or the right of {other}",
            "relative to {other}, is {ref} left or right",
            "compared with {other}, is {ref} left or right",
            "which side of {other} is {ref} on, left or right",
        ),
        "B": ("the side of {other} that {ref} is on, left or right",),
        "C": ("if {ref} is left or right of {other}", "whether {ref} is to the left or right of {other}"),
    },
    "relative_v": {
        "A": (
            "is {ref} above or below {other}",
            "is {ref} over or under {other}, above or below",
            "relative to {other}, is {ref} above or below",
            "is {ref} placed above or below {other}",
            "compared with {other}, is {ref} above or below",
            "is {ref} higher or lower than {other}, above or below",
        ),
        "B": ("the side of {other} that {ref} is on, above or below",),
        "C": ("if {ref} is above or below {other}", "whether {ref} is above or below {other}"),
    },
    "text": {
        "A": (
            "what is written in the picture",
            "what does the text say",
            "which character is shown",
            "what character is written in the image",
            "what letter or digit is in the picture",
            "what is written",
        ),
        "B": ("the text in the picture", "the character in the image", "the written character"),
        "C": ("what is written in the picture", "what the text says", "which character is shown"),
    },
    "presence": {
        "A": (
            "is there {obj}",
            "is there {obj} in the picture",
            "do you see {obj}",
            "can you see {obj}",
            "does the picture have {obj}",
            "is there {obj} anywhere",
        ),
        "C": ("if there is {obj}", "whether there is {obj}", "if you can see {obj}"),
    },
}

# Frames around each core form; "{A}" frames add the question mark themselves.
FRAMES: dict[str, tuple[str, ...]] = {
    "A": (
        "{A}?",
        "{A}?",
        "{A}?",
        "So, {A}?",
        "Hey, {A}?",
        "One question: {A}?",
        "{A}? Thanks",
        "Tell me, {A}?",
        "Quick question: {A}?",
        "{A}, do you know?",
    ),
    "B": (
        "What is {B}?",
        "What's {B}?",
        "Tell me {B}.",
        "Name {B}.",
        "Can you tell me {B}?",
        "Please tell me {B}.",
        "{B}?",
        "I'd like to know {B}.",
        "Give me {B}.",
        "Could you name {B}?",
    ),
    "C": (
        "Can you tell me {C}?",
        "Tell me {C}.",
        "Please say {C}.",
        "I want to know {C}.",
        "Could you tell me {C}?",
        "Say {C}.",
        "Do you know {C}?",
        "I wonder {C}.",
    ),
}
# Imperatives that take a core's object directly.
COUNT_IMPERATIVES = ("Count the {what}.", "Count all the {what}.", "Please count the {what}.")

HELD_OUT_FRAMES = frozenset(
    {
        "Quick question: {A}?",
        "{A}, do you know?",
        "Give me {B}.",
        "Could you name {B}?",
        "Do you know {C}?",
        "I wonder {C}.",
    }
)
HELD_OUT_CORES = frozenset(
    {
        "what color is {ref} painted",
        "which colour {ref} has",
        "what sort of shape is {ref}",
        "which shape {ref} has",
        "which size is {ref}",
        "where is {ref} placed",
        "how many {what} are in the image",
        "the count of {what}",
        "is {ref} higher or lower than {other}, above or below",
        "what letter or digit is in the picture",
        "is there {obj} anywhere",
        "if you can see {obj}",
    }
)

# Follow-ups name the previous turn's object with a pronoun; the short "And its colour?" kind too.
PRONOUNS = ("it", "it", "that one", "this one", "that shape", "the same one")
HELD_OUT_PRONOUNS = ("the same shape",)
SHORT_FOLLOW_UPS = ("And its {noun}?", "What about its {noun}?", "Its {noun}?", "And the {noun}?")
ATTRIBUTE_NOUNS = {
    "colour": ("colour", "color"),
    "shape": ("shape",),
    "size": ("size",),
    "position": ("position", "location"),
}

# Nouns that stand for "shape" in references ("the red object") and in counts ("how many things").
SHAPE_NOUNS = ("shape", "shape", "object", "thing", "item", "one")
PLURAL_SHAPE_NOUNS = ("shapes", "shapes", "objects", "things", "items", "figures")
# How an object's cell reads in a reference ("the shape in the top left"), several ways each.
CELL_PHRASES: dict[str, tuple[str, ...]] = {
    "top left": ("in the top left", "in the top-left corner", "at the top left", "in the upper left"),
    "top": ("at the top", "at the top centre", "in the top middle", "at the top center"),
    "top right": ("in the top right", "in the top-right corner", "at the top right", "in the upper right"),
    "left": ("on the left", "on the left side", "at the left", "in the middle left"),
    "centre": ("in the centre", "in the center", "in the middle", "at the centre"),
    "right": ("on the right", "on the right side", "at the right", "in the middle right"),
    "bottom left": (
        "in the bottom left",
        "in the bottom-left corner",
        "at the bottom left",
        "in the lower left",
    ),
    "bottom": ("at the bottom", "at the bottom centre", "in the bottom middle", "at the bottom center"),
    "bottom right": (
        "in the bottom right",
        "in the bottom-right corner",
        "at the bottom right",
        "in the lower right",
    ),
}
NEIGHBOUR_WORDS = {
    "left of": ("left of", "to the left of"),
    "right of": ("right of", "to the right of"),
    "above": ("above", "just above"),
    "below": ("below", "under", "just below"),
}

# Asked for JSON: an instruction appended to the question, and the answer's key per question type.
JSON_INSTRUCTIONS = (
    " Answer in JSON.",
    " Reply with JSON.",
    " Respond in JSON.",
    " (JSON)",
    " As JSON please.",
)
JSON_KEYS = {
    "colour": ("colour", "color", "answer"),
    "shape": ("shape", "answer"),
    "size": ("size", "answer"),
    "position": ("position", "location", "answer"),
    "count": ("count", "number", "answer"),
    "relative": ("side", "answer"),
    "text": ("text", "character", "answer"),
    "presence": ("present", "answer"),
    "unknown": ("answer",),
}

# System prompts people write; the eval's own-system-prompt row uses one that is not here.
SYSTEM_PROMPTS = (
    "You are a helpful assistant.",
    "You are a helpful assistant. Answer briefly.",
    "Answer the question about the image.",
    "You look at pictures and answer in a word or two.",
    "Be concise.",
    "You are an image assistant. Keep answers short.",
)

# Questions outside what the model knows, answered ``CANNOT_TELL``: attributes of things that are not
# shapes, and questions about anything else. The second list of each pair is held out of training.
CANNOT_TELL = "I can't tell"
UNKNOWN_THINGS = (
    (
        "the background",
        "the sky",
        "the floor",
        "the wall",
        "the dog",
        "the car",
        "the tree",
        "the person",
        "the house",
        "the hexagon",
        "the diamond",
        "the oval",
        "the heart",
        "the arrow",
        "the moon",
    ),
    ("the cat", "the table", "the sun", "the pentagon", "the grass", "the boat"),
)
UNKNOWN_PLURALS = (
    ("people", "dogs", "cars", "trees", "hexagons", "clouds", "hearts", "animals", "words"),
    ("cats", "birds", "pentagons", "windows"),
)
UNKNOWN_QUESTIONS = (
    (
        "What is the weather like?",
        "Who drew this picture?",
        "What time is it?",
        "Why is {ref} there?",
        "What does the picture mean?",
        "How old is {ref}?",
        "What is {ref} made of?",
        "Is {ref} happy?",
        "What is the name of {ref}?",
        "What animal is this?",
        "How much does {ref} cost?",
        "Where was this picture taken?",
        "What is the temperature?",
        "How heavy is {ref}?",
        "Which language is the text in?",
        "What is {ref} thinking?",
        "Who owns {ref}?",
        "What year is it?",
    ),
    (
        "Who is the person in the picture?",
        "What is the dog doing?",
        "Which country is this?",
        "How fast is {ref} moving?",
        "What does {ref} smell like?",
        "Is it going to rain?",
        "What brand is this?",
        "How tall is the tree?",
    ),
)

# Compositional unknowns (training only, none of them in the tokenizer's corpus, so most split into
# pieces like the held-out words do): everyday nouns in any question frame, made-up words, and
# attributes the model cannot see. The model learns "a referent that is no shape, colour or cell I
# know -> I can't tell" rather than a list of trigger words. The held-out topics' words (cat, table,
# sun, pentagon, grass, boat, bird, window, country, brand, smell, speed, rain, tall) are not here.
UNKNOWN_NOUNS = (
    "apple",
    "banana",
    "lemon",
    "carrot",
    "bread",
    "cake",
    "pizza",
    "egg",
    "chair",
    "sofa",
    "bed",
    "lamp",
    "book",
    "pen",
    "pencil",
    "cup",
    "mug",
    "bottle",
    "phone",
    "laptop",
    "keyboard",
    "horse",
    "cow",
    "pig",
    "duck",
    "rabbit",
    "lion",
    "tiger",
    "bear",
    "elephant",
    "monkey",
    "snake",
    "frog",
    "flower",
    "leaf",
    "rose",
    "bush",
    "mountain",
    "hill",
    "river",
    "lake",
    "road",
    "bridge",
    "tower",
    "castle",
    "church",
    "tram",
    "truck",
    "plane",
    "bicycle",
    "wheel",
    "shoe",
    "hat",
    "shirt",
    "coat",
    "dress",
    "key",
    "door",
    "clock",
    "bag",
    "kite",
    "guitar",
    "piano",
    "drum",
    "spoon",
    "fork",
    "plate",
    "bowl",
    "desk",
    "fence",
    "gate",
    "roof",
    "garden",
    "field",
    "forest",
    "girl",
    "boy",
    "teacher",
    "doctor",
    "king",
    "queen",
    "robot",
    "ghost",
    "dragon",
    "toy",
    "doll",
    "candle",
    "mirror",
    "pillow",
    "blanket",
    "towel",
    "ladder",
    "hammer",
    "rope",
    "bucket",
    "basket",
    "wallet",
    "coin",
    "ticket",
    "map",
    "flag",
    "poster",
    "stamp",
    "camera",
    "radio",
    "fridge",
    "oven",
    "kettle",
    "sink",
    "balloon",
    "cookie",
    "sandwich",
    "button",
    "umbrella",
    "rocket",
    "planet",
    "island",
    "bottle cap",
    "tent",
)
# Held-out topic words: no training unknown holds one, not even inside a made-up word.
HELD_OUT_WORDS = (
    "cat",
    "table",
    "sun",
    "pentagon",
    "grass",
    "boat",
    "bird",
    "window",
    "country",
    "brand",
    "smell",
    "fast",
    "speed",
    "rain",
    "tall",
    "person",
    "dog",
    "tree",
    "doing",
)
# Words of the held-out frames and cores: no made-up word holds one.
HELD_OUT_FRAME_WORDS = ("quick", "wonder", "give", "name", "sort", "paint", "digit", "placed", "know")
UNKNOWN_ATTRIBUTES = (
    "age",
    "name",
    "price",
    "weight",
    "mood",
    "flavour",
    "taste",
    "material",
    "owner",
    "purpose",
    "value",
    "temperature",
    "sound",
    "job",
    "favourite food",
    "birthday",
    "address",
    "meaning",
    "history",
    "origin",
    "voice",
    "opinion",
    "secret",
    "score",
    "recipe",
    "password",
)
# No held-out frame or core here ("Do you know ...", "which colour {ref} has").
UNKNOWN_ATTRIBUTE_TEMPLATES = (
    "What is the {attr} of {ref}?",
    "What {attr} does {ref} have?",
    "Tell me the {attr} of {ref}.",
    "Can you tell me {ref}'s {attr}?",
    "What's the {attr} of {ref}?",
)
UNKNOWN_WHOLE = (
    "What is {ref} holding?",
    "What is {ref} eating?",
    "Where is {ref} going?",
    "Who made {ref}?",
    "When was {ref} made?",
    "What is {ref} for?",
    "Is {ref} alive?",
    "Is {ref} hot?",
    "What is inside {ref}?",
    "What is behind {ref}?",
    "What season is it?",
    "What day is it?",
    "What is happening here?",
    "What sport is this?",
    "Who lives here?",
)
