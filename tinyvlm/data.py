"""Training examples: scene -> conversation -> chat template -> processor tensors, cached on disk.

Images are rendered at about twice the model's resolution (not full size; see ``render``),
encoded as the scene's PNG/JPEG and decoded, then go through the real processor. Pixel values
are cached as the uint8 pixels the processor normalised (one temporal copy), 1/8 the size of
the float patches, and expanded back exactly per batch.
"""

import random
from dataclasses import dataclass, replace
from multiprocessing import Pool
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from tinyvlm import build, dialogue, grammar, labels, pointers, questions, referents, render
from tinyvlm import tokenizer as tk
from tinyvlm.questions import Turn
from tinyvlm.scene import TRAIN_SPEC, Scene, SceneSpec, sample_scene

# Render area for training images: 4x the processor's square, i.e. 2x its linear resolution.
RENDER_AREA = 4 * build.SIDE * build.SIDE
IGNORE = -100
# Training conversations are longer than the eval's 1-3 turns: the image and the shared prompt are
# paid once per row, so every extra turn is supervision at the cost of ~15 question tokens.
TRAIN_TURNS = (4, 10)
CACHE_VERSION = 15  # bump when an example's content changes (15: the polish drills only)


@dataclass
class Example:
    input_ids: torch.Tensor  # (L,) int64
    labels: torch.Tensor  # (L,) int64, IGNORE outside assistant answers
    question_labels: torch.Tensor  # (L,) int64, IGNORE outside the user's words
    mm_token_type_ids: torch.Tensor  # (L,) int64
    pixels: torch.Tensor  # (patches, 3, P, P) uint8
    grid_thw: torch.Tensor  # (3,) int64
    token_labels: torch.Tensor  # (image tokens, len(labels.COLUMNS)) int64, see tinyvlm.labels
    ref_positions: torch.Tensor  # (K,) int64 token positions with a referent row, see tinyvlm.referents
    ref_rows: torch.Tensor  # (K, len(referents.COLUMNS)) int64
    image_keys: torch.Tensor  # (G + 1,) int64 positions of the image's start token and its G image tokens
    pointer_positions: torch.Tensor  # (P,) int64 query positions, see tinyvlm.pointers
    pointer_layers: torch.Tensor  # (P,) int64
    pointer_heads: torch.Tensor  # (P,) int64
    pointer_targets: torch.Tensor  # (P, G + 1) float32 attention targets over image_keys


def messages(
    turns: list[Turn], with_answers: bool = True, system: str | None = None, text_first: bool = False
) -> list[dict[str, Any]]:
    """Chat messages for a conversation; the image is attached to the first user turn, before its
    question (after it with ``text_first``). Without a ``system`` prompt the chat template inserts
    the default one."""
    out: list[dict[str, Any]] = [] if system is None else [{"role": "system", "content": system}]
    for i, turn in enumerate(turns):
        if i == 0:
            parts: list[dict[str, Any]] = [{"type": "image"}, {"type": "text", "text": turn.question}]
            content: Any = parts[::-1] if text_first else parts
        else:
            content = turn.question
        out.append({"role": "user", "content": content})
        if with_answers:
            out.append({"role": "assistant", "content": turn.answer})
    return out


def render_for_training(scene: Scene, seed: int) -> Any:
    scale = min(1.0, (RENDER_AREA / (scene.width * scene.height)) ** 0.5)
    return render.round_trip(render.render(scene, scale, seed=seed), scene)


def assistant_labels(ids: torch.Tensor, assistant_id: int, eos_id: int) -> torch.Tensor:
    """Labels that keep only answer tokens and their EOS (what follows each assistant tag)."""
    labels = torch.full_like(ids, IGNORE)
    inside = False
    for i, token in enumerate(ids.tolist()):
        if inside:
            labels[i] = token
            inside = token != eos_id
        elif token == assistant_id:
            inside = True
    return labels


def answer_spans(labels: torch.Tensor) -> list[tuple[int, int]]:
    """(start, end) of every run of labelled positions (one per answer, EOS included), in order."""
    spans: list[tuple[int, int]] = []
    for position, label in enumerate(labels.tolist()):
        if label == IGNORE:
            continue
        if spans and spans[-1][1] == position:
            spans[-1] = (spans[-1][0], position + 1)
        else:
            spans.append((position, position + 1))
    return spans


def question_labels(ids: torch.Tensor, user_id: int, assistant_id: int, image_ids: set[int]) -> torch.Tensor:
    """Labels on the words of every user turn (not the image): a language-model loss there teaches
    the question syntax, and the words that name objects ("the red circle") depend on the picture."""
    labels = torch.full_like(ids, IGNORE)
    inside = False
    for i, token in enumerate(ids.tolist()):
        if token == assistant_id:
            inside = False
        elif inside and token not in image_ids:
            labels[i] = token
        elif token == user_id:
            inside = True
    return labels


def _to_uint8_pixels(pixel_values: torch.Tensor, processor: Any) -> torch.Tensor:
    ip = processor.image_processor
    patch = ip.patch_size
    x = pixel_values.reshape(-1, 3, ip.temporal_patch_size, patch, patch)[:, :, 0]
    mean = torch.tensor(ip.image_mean).view(1, 3, 1, 1)
    std = torch.tensor(ip.image_std).view(1, 3, 1, 1)
    return torch.round((x * std + mean) * 255.0).clamp(0, 255).to(torch.uint8)


def pixels_to_values(pixels: torch.Tensor, processor: Any) -> torch.Tensor:
    """Inverse of the cache encoding: the float patches the processor would have produced."""
    ip = processor.image_processor
    mean = torch.tensor(ip.image_mean).view(1, 3, 1, 1)
    std = torch.tensor(ip.image_std).view(1, 3, 1, 1)
    x = (pixels.float() * ip.rescale_factor - mean) / std
    x = x[:, :, None].expand(-1, -1, ip.temporal_patch_size, -1, -1)
    return x.reshape(pixels.shape[0], -1)


def picture_order(rows: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """(h*w, ...) rows in the tower's patch order (merge x merge blocks, one per image token, blocks
    row-major) -> an (h, w, ...) grid in picture order."""
    m, tail = build.MERGE, rows.shape[1:]
    blocks = rows.reshape(height // m, width // m, m, m, *tail)
    return blocks.transpose(1, 2).reshape(height, width, *tail)


def token_offsets(processor: Any, text: str, image_tokens: int, ids: torch.Tensor) -> tuple[str, list]:
    """The rendered ``text`` with its image placeholder expanded, and its tokens' character offsets."""
    expanded = text.replace(tk.IMAGE, tk.IMAGE * image_tokens, 1)
    enc = processor.tokenizer(expanded, add_special_tokens=False, return_offsets_mapping=True)
    assert enc["input_ids"] == ids.tolist(), "the tokenizer alone must reproduce the processor's ids"
    return expanded, enc["offset_mapping"]


def referent_targets(text: str, offsets: list, turns: list[Turn]) -> tuple[torch.Tensor, torch.Tensor]:
    """Referent positions and rows (``tinyvlm.referents``)."""
    positions, rows = referents.targets(text, offsets, turns)
    return torch.tensor(positions, dtype=torch.int64), torch.tensor(rows, dtype=torch.int64).reshape(
        -1, len(referents.COLUMNS)
    )


def pointer_targets(
    text: str, offsets: list, turns: list[Turn], scene: Scene, grid_h: int, grid_w: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Pointer query positions, layers, heads and target distributions (``tinyvlm.pointers``)."""
    found = pointers.pointers(text, offsets, turns, scene, grid_h, grid_w)
    targets = torch.zeros(len(found), grid_h * grid_w + 1)
    for row, pointer in enumerate(found):
        targets[row, list(pointer.slots)] = 1.0 / len(pointer.slots)

    def column(name: str) -> torch.Tensor:
        return torch.tensor([getattr(p, name) for p in found], dtype=torch.int64)

    return column("position"), column("layer"), column("head"), targets


def make_example(
    processor: Any, scene: Scene, turns: list[Turn], seed: int, system: str | None = None
) -> Example:
    text = processor.apply_chat_template(messages(turns, system=system), tokenize=False)
    enc = processor(text=[text], images=[render_for_training(scene, seed)], return_tensors="pt")
    ids = enc["input_ids"][0]
    tok = processor.tokenizer
    assistant_id = tok.convert_tokens_to_ids("<|assistant|>")
    answer_labels = assistant_labels(ids, assistant_id, tok.eos_token_id)
    image_ids = set(tok.convert_tokens_to_ids([tk.IMAGE, tk.BEGIN_IMAGE, tk.END_IMAGE]))
    user_labels = question_labels(ids, tok.convert_tokens_to_ids("<|user|>"), assistant_id, image_ids)
    grid = enc["image_grid_thw"][0]
    merge = processor.image_processor.merge_size
    grid_h, grid_w = int(grid[1]) // merge, int(grid[2]) // merge
    expanded, offsets = token_offsets(processor, text, grid_h * grid_w, ids)
    ref_positions, ref_rows = referent_targets(expanded, offsets, turns)
    begin = int((ids == tok.convert_tokens_to_ids(tk.BEGIN_IMAGE)).nonzero()[0])
    image_keys = torch.arange(begin, begin + grid_h * grid_w + 1)
    assert (ids[image_keys[1:]] == tok.convert_tokens_to_ids(tk.IMAGE)).all()
    pointer_positions, pointer_layers, pointer_heads, targets = pointer_targets(
        expanded, offsets, turns, scene, grid_h, grid_w
    )
    return Example(
        ids,
        answer_labels,
        user_labels,
        enc["mm_token_type_ids"][0],
        _to_uint8_pixels(enc["pixel_values"], processor),
        grid,
        labels.token_labels(scene, grid_h, grid_w),
        ref_positions,
        ref_rows,
        image_keys,
        pointer_positions,
        pointer_layers,
        pointer_heads,
        targets,
    )


_WORKER_PROCESSOR: Any = None


def _init_worker() -> None:
    global _WORKER_PROCESSOR
    torch.set_num_threads(1)
    _WORKER_PROCESSOR = build.build_processor()


def training_conversation(seed: int, index: int, spec: SceneSpec = TRAIN_SPEC) -> tuple[Scene, list[Turn]]:
    """The scene and turns of training example ``index`` of the set drawn with ``seed``: in people's
    words (``tinyvlm.dialogue``) for a varied spec, else in the first model's phrasings."""
    rng = random.Random(f"{seed}-{index}")  # per-example stream: order-independent, reproducible
    scene = sample_scene(rng, spec)
    if spec.variety:
        style = dialogue.TRAINING
        if spec.unknown_weight is not None:
            style = replace(style, unknown_weight=spec.unknown_weight)
        turns = dialogue.conversation(scene, rng, style, n_turns=rng.randint(*TRAIN_TURNS))
        text = dialogue.ask_text(scene, rng, dialogue.Split.TRAIN)
        text = None if text is None else dialogue.dressed(text, rng)
        count = dialogue.dressed(dialogue.ask_count(scene, rng, dialogue.Split.TRAIN), rng)
    else:
        turns = questions.conversation(scene, rng, n_turns=rng.randint(*TRAIN_TURNS))
        text = questions.ask_text(scene, rng, held_out=False)
        count = questions.ask_count(scene, rng, held_out=False)
    if text is not None and all(t.qtype != "text" for t in turns):
        turns = [text, *turns]  # the glyph is on a third of the pictures: always ask it in training
    # Counting is the slowest answer to learn: every training conversation ends with one more count.
    turns = [*turns, count]
    if spec.drills:
        drills = questions.drills(scene, rng, lambda: _relative_drills(scene, rng, spec))
        if spec.variety:  # typed as people type: case, marks, spaces ("WHAT COLOUR IS ...")
            drills = [replace(t, question=grammar.noisy(t.question, rng)) for t in drills]
        turns = [*turns, *drills]
    if spec.only_attribute is not None:
        turn = questions.ask_attribute(scene.objects[0], spec.only_attribute, scene, rng, False)
        turns = [turn] if turn is not None else turns
    return scene, turns


def _relative_drills(scene: Scene, rng: random.Random, spec: SceneSpec) -> list[Turn]:
    """For a varied spec, two more left/right or above/below questions: one in people's words, one
    in the first model's phrasing (the type that drifts to chance without them)."""
    if not spec.variety:
        return []
    turn = dialogue.ask_relative(scene, rng, dialogue.Split.TRAIN)
    out = [] if turn is None else [dialogue.dressed(turn, rng)]
    legacy = questions.ask_relative(scene, rng, False)
    return out + ([] if legacy is None else [legacy])


def training_system_prompt(seed: int, index: int, spec: SceneSpec) -> str | None:
    """The system prompt of training example ``index``: its own stream, so the turns stay as drawn."""
    return dialogue.system_prompt(random.Random(f"{seed}-{index}-system")) if spec.variety else None


def _example_for(args: tuple[int, int, SceneSpec]) -> dict[str, np.ndarray]:
    seed, index, spec = args
    scene, turns = training_conversation(seed, index, spec)
    system = training_system_prompt(seed, index, spec)
    example = make_example(_WORKER_PROCESSOR, scene, turns, seed=index, system=system)
    # numpy, not tensors, across processes: torch shares tensors by file descriptor and runs out.
    return {k: v.numpy() for k, v in example.__dict__.items()}


def generate(n: int, seed: int, spec: SceneSpec = TRAIN_SPEC, workers: int = 2) -> list[Example]:
    jobs = [(seed, i, spec) for i in range(n)]
    with Pool(workers, initializer=_init_worker) as pool:
        arrays = pool.map(_example_for, jobs, chunksize=64)
    return [Example(**{k: torch.from_numpy(v) for k, v in a.items()}) for a in arrays]


def load_or_generate(
    n: int, seed: int, cache_dir: Path, workers: int = 2, spec: SceneSpec = TRAIN_SPEC, tag: str = ""
) -> list[Example]:
    unknown = "" if spec.unknown_weight is None else f"-u{spec.unknown_weight:g}"
    path = cache_dir / f"train{tag}{unknown}-v{CACHE_VERSION}-s{seed}-n{n}.safetensors"
    if path.exists():
        return _load_examples(path)
    examples = generate(n, seed, spec=spec, workers=workers)
    cache_dir.mkdir(parents=True, exist_ok=True)
    _save_examples(examples, path)
    return examples


_FIELDS = (
    "input_ids",
    "labels",
    "question_labels",
    "mm_token_type_ids",
    "pixels",
    "grid_thw",
    "token_labels",
    "ref_positions",
    "ref_rows",
    "image_keys",
    "pointer_positions",
    "pointer_layers",
    "pointer_heads",
    "pointer_targets",
)


def _save_examples(examples: list[Example], path: Path) -> None:
    """safetensors, not pickle: a cache file can hold tensors and nothing else."""
    flat = {
        f"{i}.{name}": getattr(ex, name).contiguous() for i, ex in enumerate(examples) for name in _FIELDS
    }
    save_file(flat, str(path))


def _load_examples(path: Path) -> list[Example]:
    flat = load_file(str(path))
    count = len(flat) // len(_FIELDS)
    return [Example(**{name: flat[f"{i}.{name}"] for name in _FIELDS}) for i in range(count)]


def collate(batch: list[Example], processor: Any, pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded batch in the model's input format (labels IGNORE on padding)."""
    length = max(len(e.input_ids) for e in batch)

    def pad(values: torch.Tensor, fill: int) -> torch.Tensor:
        return torch.cat([values, values.new_full((length - len(values),), fill)])

    return {
        "input_ids": torch.stack([pad(e.input_ids, pad_id) for e in batch]),
        "attention_mask": torch.stack([pad(torch.ones_like(e.input_ids), 0) for e in batch]),
        "mm_token_type_ids": torch.stack([pad(e.mm_token_type_ids, 0) for e in batch]),
        "labels": torch.stack([pad(e.labels, IGNORE) for e in batch]),
        "question_labels": torch.stack([pad(e.question_labels, IGNORE) for e in batch]),
        **collate_images(batch, processor),
        # One entry per referent row of the batch: its row in the batch, its position, its labels.
        "ref_batch_rows": torch.cat([torch.full_like(e.ref_positions, i) for i, e in enumerate(batch)]),
        "ref_positions": torch.cat([e.ref_positions for e in batch]),
        "ref_rows": torch.cat([e.ref_rows for e in batch]),
        "image_keys": torch.stack([e.image_keys for e in batch]),
        "pointer_batch_rows": torch.cat(
            [torch.full_like(e.pointer_positions, i) for i, e in enumerate(batch)]
        ),
        "pointer_positions": torch.cat([e.pointer_positions for e in batch]),
        "pointer_layers": torch.cat([e.pointer_layers for e in batch]),
        "pointer_heads": torch.cat([e.pointer_heads for e in batch]),
        "pointer_targets": torch.cat([e.pointer_targets for e in batch]),
    }


def collate_images(batch: list[Example], processor: Any) -> dict[str, torch.Tensor]:
    """The pictures of a batch and their image-token labels only (the vision stage)."""
    return {
        "pixel_values": torch.cat([pixels_to_values(e.pixels, processor) for e in batch]),
        "image_grid_thw": torch.stack([e.grid_thw for e in batch]),
        "token_labels": torch.cat([e.token_labels for e in batch]),
    }


def check_round_trip(processor: Any, seed: int = 0) -> float:
    """Max abs difference between cached-and-expanded pixels and the processor's own output."""
    rng = random.Random(seed)
    scene = sample_scene(rng)
    image = render_for_training(scene, seed)
    values = processor.image_processor(images=[image], return_tensors="pt")["pixel_values"]
    restored = pixels_to_values(_to_uint8_pixels(values, processor), processor)
    return float((restored - values).abs().max())


def token_stats(examples: list[Example]) -> dict[str, float]:
    lengths = np.array([len(e.input_ids) for e in examples])
    return {"mean_len": float(lengths.mean()), "max_len": float(lengths.max())}
