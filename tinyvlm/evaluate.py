"""Exact-match evaluation of vlmq-tiny per question type and per turn, for every quantization mode.

    python -m tinyvlm.evaluate                               # models/vlmq-tiny, all modes
    python -m tinyvlm.evaluate --model runs/vlmq-tiny --modes none int8 --json runs/eval.json

Multi-turn conversations use the model's own earlier answers as history, like a real client.
Every mode answers the same images; the modes are loaded with ``services.vlm.loading``
(the engine's quantization module).
"""

import argparse
import json
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

import services  # noqa: F401  (registers the processor)
from services.vlm.loading import load_model
from services.vlm.quantization import model_size_bytes
from tinyvlm import data, evalsets
from tinyvlm.evalsets import EvalSet, Item
from tinyvlm.questions import Turn

MODES = ("none", "bf16", "int8", "int4")
LABELS = {"none": "fp32", "bf16": "bf16", "int8": "int8", "int4": "int4"}


@torch.inference_mode()
def answer_batch(
    model: Any, processor: Any, images: list[Any], histories: list[list[dict[str, Any]]]
) -> list[str]:
    """Greedy answers for a batch of conversations (left-padded)."""
    texts = [processor.apply_chat_template(h, add_generation_prompt=True, tokenize=False) for h in histories]
    inputs = processor(text=texts, images=images, padding=True, return_tensors="pt")
    inputs["pixel_values"] = inputs["pixel_values"].to(model.dtype)
    out = model.generate(**inputs, max_new_tokens=6, do_sample=False)
    new = out[:, inputs["input_ids"].shape[1] :]
    return [a.strip() for a in processor.batch_decode(new, skip_special_tokens=True)]


def run_conversations(
    model: Any, processor: Any, convs: list[list[Turn]], images: list[Any]
) -> list[list[str]]:
    """Answers turn by turn; each turn's history holds the model's previous answers."""
    answers: list[list[str]] = [[] for _ in convs]
    for turn in range(max(len(turns) for turns in convs)):
        live = [i for i, turns in enumerate(convs) if len(turns) > turn]
        histories = []
        for i in live:
            history = data.messages(convs[i][: turn + 1], with_answers=True)
            for k, given in enumerate(answers[i]):
                history[2 * k + 1]["content"] = given
            histories.append(history[:-1])  # drop this turn's gold answer
        given_now = answer_batch(model, processor, [images[i] for i in live], histories)
        for i, answer in zip(live, given_now, strict=True):
            answers[i].append(answer)
    return answers


class Tally:
    """Exact-match counts by question type, turn and phrasing (seen in training or held out), and
    the wrong answers (for ``--errors``)."""

    def __init__(self) -> None:
        self.hits: dict[str, list[int]] = defaultdict(lambda: [0, 0])
        self.errors: list[dict[str, Any]] = []

    def add(self, item: Item, answers: list[str]) -> None:
        for turn_index, (turn, given) in enumerate(zip(item.turns, answers, strict=True)):
            ok = int(given == turn.answer)
            if not ok:
                self.errors.append(_error(item, turn_index, given))
            phrasing = "phrasing_held_out" if turn.held_out_phrasing else "phrasing_seen"
            for key in ("overall", f"type/{turn.qtype}", f"turn/{turn_index + 1}", phrasing):
                self.hits[key][0] += ok
                self.hits[key][1] += 1

    def summary(self) -> dict[str, dict[str, float]]:
        return {k: {"acc": round(100 * h / n, 2), "n": n} for k, (h, n) in sorted(self.hits.items())}


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


def evaluate_set(
    models: dict[str, tuple[Any, Any]], eval_set: EvalSet, batch: int, limit: int | None
) -> tuple[dict, dict[str, list[dict[str, Any]]]]:
    """Per mode: the accuracy summary, and the wrong answers."""
    items = list(evalsets.items(eval_set, limit))
    tallies = {mode: Tally() for mode in models}
    seconds = dict.fromkeys(models, 0.0)
    for start in tqdm(range(0, len(items), batch), desc=eval_set.name, unit="batch"):
        chunk = items[start : start + batch]
        images = [evalsets.client_image(item, seed=start + i) for i, item in enumerate(chunk)]
        for mode, (model, processor) in models.items():
            began = time.time()
            answers = run_conversations(model, processor, [item.turns for item in chunk], images)
            seconds[mode] += time.time() - began
            for item, given in zip(chunk, answers, strict=True):
                tallies[mode].add(item, given)
    results = {mode: {**tallies[mode].summary(), "seconds": round(seconds[mode], 1)} for mode in models}
    return results, {mode: tallies[mode].errors for mode in models}


def table(results: dict[str, dict[str, dict]], modes: list[str]) -> str:
    """Markdown table: one row per metric; per set, its question count then one column per mode."""
    keys = sorted({k for r in results.values() for m in modes for k in r[m] if k != "seconds"})
    keys.sort(key=lambda k: (k != "overall", k.split("/")[0], k))
    head = ["metric"]
    for name in results:
        head += [f"{name} n"] + [f"{name} {LABELS[m]}" for m in modes]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for key in keys:
        cells = [key]
        for r in results.values():
            first = r[modes[0]].get(key)
            cells.append(str(first["n"]) if first else "-")
            cells += [f"{r[m][key]['acc']:.1f}" if key in r[m] else "-" for m in modes]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", type=Path, default=Path("models/vlmq-tiny"))
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    parser.add_argument("--json", type=Path, default=Path("runs/eval.json"))
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--errors", type=Path, default=None, help="write every wrong answer here (JSONL)")
    parser.add_argument("--limit", type=int, default=None, help="questions per set (default: 2000 / 1000)")
    args = parser.parse_args()
    torch.set_num_threads(2)
    models = {mode: load_model(args.model, quantize=mode) for mode in args.modes}
    results, errors = {}, {}
    for eval_set in (evalsets.HELDOUT, evalsets.WIDE):
        results[eval_set.name], errors[eval_set.name] = evaluate_set(models, eval_set, args.batch, args.limit)
    report = {
        "model": str(args.model),
        "size_bytes": {LABELS[m]: model_size_bytes(models[m][0]) for m in args.modes},
        "results": {s: {LABELS[m]: r[m] for m in args.modes} for s, r in results.items()},
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=1))
    if args.errors is not None:  # one line per wrong answer: set, mode, question, expected, given, scene
        with args.errors.open("w") as out:
            for name, by_mode in errors.items():
                for mode, wrong in by_mode.items():
                    out.writelines(json.dumps({"set": name, "mode": LABELS[mode], **e}) + "\n" for e in wrong)
    print(table(results, args.modes))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
