"""Exact-match evaluation of vlmq-tiny per question type and per turn, for every quantization mode.

    python -m tinyvlm.evaluate                               # models/vlmq-tiny, all modes
    python -m tinyvlm.evaluate --model runs/vlmq-tiny --modes none int8 --json runs/eval.json
    python -m tinyvlm.evaluate --backend generate            # model.generate instead of the engine

Multi-turn conversations use the model's own earlier answers as history, like a real client.
Every mode answers the same images; the modes are loaded with ``services.vlm.loading``
(the engine's quantization module). Answers come from the serving engine by default
(``tinyvlm.engine_answers``: what the service answers, with its caches and batching), or from
``model.generate`` on left-padded batches (``--backend generate``, the reference it was checked
against).
"""

import argparse
import functools
import json
import math
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

import services  # noqa: F401  (registers the processor)
from services.vlm.loading import load_model
from services.vlm.quantization import model_size_bytes
from tinyvlm import data, evalrows, evalsets
from tinyvlm.engine_answers import EngineAnswerer
from tinyvlm.evalrows import Row
from tinyvlm.evalsets import Item
from tinyvlm.questions import Turn

MODES = ("none", "bf16", "int8", "int4")
LABELS = {"none": "fp32", "bf16": "bf16", "int8": "int8", "int4": "int4"}


@torch.inference_mode()
def answer_batch(
    model: Any,
    processor: Any,
    images: list[Any],
    histories: list[list[dict[str, Any]]],
    max_new_tokens: int = 6,
) -> list[str]:
    """Greedy answers for a batch of conversations (left-padded)."""
    texts = [processor.apply_chat_template(h, add_generation_prompt=True, tokenize=False) for h in histories]
    inputs = processor(text=texts, images=images, padding=True, return_tensors="pt")
    inputs["pixel_values"] = inputs["pixel_values"].to(model.dtype)
    out = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False)
    new = out[:, inputs["input_ids"].shape[1] :]
    return [a.strip() for a in processor.batch_decode(new, skip_special_tokens=True)]


def run_conversations(
    model: Any,
    processor: Any,
    convs: list[list[Turn]],
    images: list[Any],
    systems: list[str | None] | None = None,
    text_first: list[bool] | None = None,
) -> list[list[str]]:
    """Answers turn by turn; each turn's history holds the model's previous answers."""
    answers: list[list[str]] = [[] for _ in convs]
    systems = systems or [None] * len(convs)
    text_first = text_first or [False] * len(convs)
    offset = [0 if s is None else 1 for s in systems]
    for turn in range(max(len(turns) for turns in convs)):
        live = [i for i, turns in enumerate(convs) if len(turns) > turn]
        histories = []
        for i in live:
            history = data.messages(convs[i][: turn + 1], True, systems[i], text_first[i])
            for k, given in enumerate(answers[i]):
                history[offset[i] + 2 * k + 1]["content"] = given
            histories.append(history[:-1])  # drop this turn's gold answer
        json_asked = any(convs[i][turn].json for i in live)
        given_now = answer_batch(
            model, processor, [images[i] for i in live], histories, max_new_tokens=14 if json_asked else 6
        )
        for i, answer in zip(live, given_now, strict=True):
            answers[i].append(answer)
    return answers


def wilson(hits: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95 % Wilson score interval of a proportion, in percent."""
    if n == 0:
        return 0.0, 0.0
    p = hits / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return round(100 * (centre - half), 2), round(100 * (centre + half), 2)


class Tally:
    """Exact-match counts by question type, turn and phrasing (seen in training or held out), and
    the wrong answers (for ``--errors``)."""

    def __init__(self) -> None:
        self.hits: dict[str, list[int]] = defaultdict(lambda: [0, 0])
        self.errors: list[dict[str, Any]] = []

    def add(self, item: Item, answers: list[str]) -> None:
        for turn_index, (turn, given) in enumerate(zip(item.turns, answers, strict=True)):
            ok = int(evalrows.answer_is_right(turn, given))
            if not ok:
                self.errors.append(_error(item, turn_index, given))
            phrasing = "phrasing_held_out" if turn.held_out_phrasing else "phrasing_seen"
            for key in ("overall", f"type/{turn.qtype}", f"turn/{turn_index + 1}", phrasing):
                self.hits[key][0] += ok
                self.hits[key][1] += 1

    def summary(self) -> dict[str, dict[str, Any]]:
        return {
            k: {"acc": round(100 * h / n, 2), "n": n, "ci95": wilson(h, n)}
            for k, (h, n) in sorted(self.hits.items())
        }


def _error(item: Item, turn_index: int, given: str) -> dict[str, Any]:
    turn = item.turns[turn_index]
    return {
        "type": turn.qtype,
        "turn": turn_index + 1,
        "question": turn.question,
        "expected": turn.answer,
        "given": given,
        "objects": [f"{o.size} {o.colour} {o.shape} {o.cell}" for o in item.scene.objects],
        "glyph": None if item.scene.glyph is None else item.scene.glyph.char,
        "size": [item.scene.width, item.scene.height],
    }


Answerer = Callable[[list[list[Turn]], list[Any], list[str | None], list[bool]], list[list[str]]]


def answerers(models: dict[str, tuple[Any, Any]], backend: str, batch: int) -> dict[str, Answerer]:
    """Per mode, what answers a chunk of conversations (engines are started here)."""
    if backend == "generate":
        return {mode: functools.partial(run_conversations, *loaded) for mode, loaded in models.items()}
    engines = {mode: EngineAnswerer(*loaded, max_batch=batch) for mode, loaded in models.items()}
    return {mode: engine.run_conversations for mode, engine in engines.items()}


def evaluate_row(
    answer: dict[str, Answerer], row: Row, chunk_size: int
) -> tuple[dict, dict[str, list[dict[str, Any]]]]:
    """Per mode: the accuracy summary, and the wrong answers."""
    items = row.items
    tallies = {mode: Tally() for mode in answer}
    seconds = dict.fromkeys(answer, 0.0)
    for start in tqdm(range(0, len(items), chunk_size), desc=row.name, unit="chunk", leave=False):
        chunk = items[start : start + chunk_size]
        images = [evalsets.client_image(item, seed=start + i) for i, item in enumerate(chunk)]
        convs, systems = [item.turns for item in chunk], [item.system for item in chunk]
        text_first = [item.text_first for item in chunk]
        for mode, run in answer.items():
            began = time.time()
            answers = run(convs, images, systems, text_first)
            seconds[mode] += time.time() - began
            for item, given in zip(chunk, answers, strict=True):
                tallies[mode].add(item, given)
    results = {mode: {**tallies[mode].summary(), "seconds": round(seconds[mode], 1)} for mode in answer}
    return results, {mode: tallies[mode].errors for mode in answer}


def all_rows(limit: int | None) -> list[Row]:
    """The first model's held-out and wide sets, then the people's-own-words rows."""
    legacy = [Row(s.name, list(evalsets.items(s, limit))) for s in (evalsets.HELDOUT, evalsets.WIDE)]
    return [*legacy, *evalrows.rows()]


def table(results: dict[str, dict[str, dict]], rows: list[Row], modes: list[str]) -> str:
    """Markdown table: one line per row: its question count, then accuracy (95 % interval) per mode,
    and for a paired row its accuracy as a share of the unchanged row's (fp32)."""
    head = ["row", "n", *(LABELS[m] for m in modes), "vs unchanged"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        by_mode = results[row.name]
        cells = [row.name, str(by_mode[modes[0]]["overall"]["n"])]
        for mode in modes:
            overall = by_mode[mode]["overall"]
            low, high = overall["ci95"]
            cells.append(f"{overall['acc']:.1f} ({low:.1f}-{high:.1f})")
        ratio = ""
        if row.unchanged is not None:
            base = results[row.unchanged][modes[0]]["overall"]["acc"]
            ratio = f"{100 * by_mode[modes[0]]['overall']['acc'] / max(base, 1e-9):.1f} %"
        lines.append("| " + " | ".join([*cells, ratio]) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", type=Path, default=Path("models/vlmq-tiny"))
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    parser.add_argument("--json", type=Path, default=Path("runs/eval.json"))
    parser.add_argument("--backend", choices=("engine", "generate"), default="engine")
    parser.add_argument("--batch", type=int, default=48, help="sequences per forward (engine: max_batch)")
    parser.add_argument("--errors", type=Path, default=None, help="write every wrong answer here (JSONL)")
    parser.add_argument("--limit", type=int, default=None, help="questions of the held-out/wide sets")
    parser.add_argument(
        "--rows", nargs="*", default=None, help="only rows whose name starts with one of these"
    )
    args = parser.parse_args()
    torch.set_num_threads(2)
    models = {mode: load_model(args.model, quantize=mode) for mode in args.modes}
    rows = all_rows(args.limit)
    if args.rows is not None:
        rows = [r for r in rows if any(r.name.startswith(p) for p in args.rows)]
    answer = answerers(models, args.backend, args.batch)
    # the engine batches continuously: hand it several batches' worth so the tail of a turn is short
    chunk_size = 4 * args.batch if args.backend == "engine" else args.batch
    results, errors = {}, {}
    began = time.time()
    for row in rows:
        results[row.name], errors[row.name] = evaluate_row(answer, row, chunk_size)
        print(
            f"{row.name}: "
            + ", ".join(f"{LABELS[m]} {results[row.name][m]['overall']['acc']:.1f}" for m in models)
        )
    report = {
        "model": str(args.model),
        "backend": args.backend,
        "seconds": round(time.time() - began),
        "size_bytes": {LABELS[m]: model_size_bytes(models[m][0]) for m in args.modes},
        "parameters": sum(p.numel() for p in models[args.modes[0]][0].parameters()),
        "rows": {r.name: {"unchanged": r.unchanged} for r in rows},
        "results": {name: {LABELS[m]: r[m] for m in args.modes} for name, r in results.items()},
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=1))
    if args.errors is not None:  # one line per wrong answer: row, mode, question, expected, given, scene
        with args.errors.open("w") as out:
            for name, by_mode in errors.items():
                for mode, wrong in by_mode.items():
                    out.writelines(json.dumps({"set": name, "mode": LABELS[mode], **e}) + "\n" for e in wrong)
    print(table(results, rows, args.modes))
    print(f"wrote {args.json} after {report['seconds']} s")


if __name__ == "__main__":
    main()
