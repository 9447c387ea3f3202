"""How well can the language model answer if it sees perfectly? A diagnostic.

    python -m tinyvlm.oracle                 # the recipe's 950 steps, perfect image features
    python -m tinyvlm.oracle --steps 2400

Trains vlmq-tiny exactly as ``tinyvlm.train`` does, except that the vision tower is replaced by
an embedding of the image-token labels (``tinyvlm.labels``: colour, shape, size, grid cell, glyph
and object centre under each token): features that carry everything the answers need, noise-free.
Then reports teacher-forced exact match per question type on training-style conversations from
another seed. What the language model cannot learn here in the budget, no vision tower will fix.
"""

import argparse
import json
from collections import Counter
from dataclasses import replace
from pathlib import Path

import torch
from torch import nn
from transformers import Glm4vForConditionalGeneration

from tinyvlm import build, data, labels, objective, train

HELD_OUT_SEED = 4321  # training uses 1234; per-example streams never meet
BATCH = 16


class LabelFeatures(nn.Module):
    """The sum of one learnt embedding per label column and one for what the token shows (nothing,
    an object, the glyph; the vision tower is trained to tell these too): a perfect stand-in for it."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.columns = nn.ModuleList(nn.Embedding(labels.CLASSES[name], hidden) for name in labels.COLUMNS)
        self.kind = nn.Embedding(labels.KINDS, hidden)

    def forward(self, token_labels: torch.Tensor) -> torch.Tensor:
        columns = [embed(token_labels[:, i]) for i, embed in enumerate(self.columns)]
        return torch.stack(columns).sum(0) + self.kind(labels.kinds(token_labels))


def answers_right(predicted: torch.Tensor, gold: torch.Tensor) -> list[bool]:
    """Per answer of one row, in order: every token of it (EOS included) predicted right.
    ``gold`` is IGNORE outside answers; ``predicted[i]`` is the prediction for ``gold[i]``."""
    return [bool((predicted[a:b] == gold[a:b]).all()) for a, b in data.answer_spans(gold)]


def evaluate(
    model: Glm4vForConditionalGeneration,
    oracle: LabelFeatures,
    examples: list[data.Example],
    question_types: list[list[str]],
) -> dict[str, float]:
    """Teacher-forced exact match in %, overall and per question type."""
    processor = build.build_processor()
    right: Counter[str] = Counter()
    asked: Counter[str] = Counter()
    model.eval()
    with torch.no_grad():
        for start in range(0, len(examples), BATCH):
            batch = data.collate(examples[start : start + BATCH], processor, processor.tokenizer.pad_token_id)
            forward = objective.forward_logits(model, batch, oracle(batch["token_labels"]))
            logits, prefix = forward.logits, forward.prefix
            predicted, gold = logits[:, :-1].argmax(-1), batch["labels"][:, prefix + 1 :]
            for row, types in enumerate(question_types[start : start + BATCH]):
                marks = answers_right(predicted[row], gold[row])
                assert len(marks) == len(types), "every turn has one answer"
                for qtype, ok in zip(types, marks, strict=True):
                    right[qtype] += ok
                    asked[qtype] += 1
    for qtype in [q for q in asked if "=" in q]:  # "count=3": also tallied under "count"
        right[qtype.split("=")[0]] += right[qtype]
        asked[qtype.split("=")[0]] += asked[qtype]
    table = {qtype: round(100 * right[qtype] / asked[qtype], 1) for qtype in sorted(asked)}
    plain = [q for q in asked if "=" not in q]
    overall = 100 * sum(right[q] for q in plain) / sum(asked[q] for q in plain)
    return {"overall": round(overall, 1), **table}


def held_out(count: int, cache_dir: Path, workers: int) -> tuple[list[data.Example], list[list[str]]]:
    """Held-out conversations and their turns' types; count questions also carry their answer
    ("count=3"), so the report shows which counts go wrong."""
    examples = data.load_or_generate(count, HELD_OUT_SEED, cache_dir, workers)
    types = [
        [
            f"count={t.answer}" if t.qtype == "count" else t.qtype
            for t in data.training_conversation(HELD_OUT_SEED, i)[1]
        ]
        for i in range(count)
    ]
    return examples, types


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=train.TrainConfig.steps)
    parser.add_argument("--out", type=Path, default=Path("runs/oracle"))
    parser.add_argument("--cache-dir", type=Path, default=Path("runs/cache"))
    parser.add_argument("--held-out", type=int, default=600, help="conversations to score (~7 turns each)")
    parser.add_argument("--smoke", action="store_true", help="tiny run for CI")
    args = parser.parse_args()
    torch.set_num_threads(2)
    # The dense image-token loss is moot: the features are the labels. The polish stage is left out
    # so that the measure stays the joint stage's (as in the tinyvlm README's history).
    cfg = replace(train.SMOKE if args.smoke else train.TrainConfig(), token_weight=0.0, polish_steps=0)
    cfg = cfg if args.smoke else replace(cfg, steps=args.steps)
    oracle = LabelFeatures(build.TEXT_HIDDEN)
    train.train(cfg, args.out, args.cache_dir, oracle=oracle)
    model = Glm4vForConditionalGeneration.from_pretrained(args.out)
    examples, types = held_out(8 if args.smoke else args.held_out, args.cache_dir, cfg.workers)
    result = {"steps": cfg.steps, **evaluate(model, oracle, examples, types)}
    (args.out / "oracle.json").write_text(json.dumps(result, indent=1) + "\n")
    print(" | ".join(f"{k} {v}" for k, v in result.items()))


if __name__ == "__main__":
    main()
