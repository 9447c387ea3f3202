"""Train vlmq-tiny on procedural visual QA (CPU, seeded, reproducible).

    python -m tinyvlm.train                      # the recipe into runs/vlmq-tiny (66-76 min, one core)
    python -m tinyvlm.train --smoke              # CI check, < 60 s
    python -m tinyvlm.train --out models/vlmq-tiny
    python -m tinyvlm.train --init CKPT --steps 0 --vision-steps 0 --out runs/x  # the polish stage alone

A full run leaves the joint stage's weights in ``OUT/joint`` (with the auxiliary heads', which the
polish's token loss reads): the polish stage alone on them (``--init OUT/joint``) writes the full
run's own bytes, so a polish change is tried in minutes.

Stages: the vision tower alone, then everything through a curriculum, then a short polish at a lower
learning rate on drills of what the model gets wrong most. Writes the checkpoint (model +
processor) and ``train_log.jsonl`` (stage, losses and answer-token accuracy every ``log_every``
steps) into ``--out``.
The objective is in ``tinyvlm.objective``, the image-token labels in ``tinyvlm.labels``.
"""

import argparse
import json
import random
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import torch
from safetensors.torch import load_file, save_file
from tqdm import tqdm
from transformers import Glm4vForConditionalGeneration

from services.vlm.patch_embed import linear_patch_embed
from tinyvlm import attention, build, data, objective, referents
from tinyvlm.scene import TRAIN_SPEC, SceneSpec
from tinyvlm.schedule import fit, lr_at


@dataclass(frozen=True)
class Phase:
    """A curriculum stage: from ``start`` (a share of all steps) on, batches come from its data."""

    start: float
    examples: int
    spec: SceneSpec
    tag: str


# Easy first. On the full mix from step 0 the language model settles on the answer prior and
# ignores the image (its loss does not change when the images are shuffled). A single object
# filling the picture, asked its colour, makes every image token useful, so reading them pays off
# at once; then the objects shrink and multiply to the real distribution.
ONE = (1, 0, 0, 0, 0, 0)
CURRICULUM = (
    Phase(
        0.0, 800, replace(TRAIN_SPEC, object_weights=ONE, radius_scale=3.0, only_attribute="colour"), "-fill"
    ),
    Phase(0.04, 1500, replace(TRAIN_SPEC, object_weights=ONE, radius_scale=1.5), "-one"),
    Phase(0.12, 3000, replace(TRAIN_SPEC, object_weights=(2, 2, 1, 0, 0, 0)), "-few"),
    Phase(0.25, 0, TRAIN_SPEC, ""),  # examples: TrainConfig.examples
)


@dataclass(frozen=True)
class TrainConfig:
    examples: int = 15000
    steps: int = 2600
    batch: int = 16
    lr: float = 1.2e-3
    warmup: int = 30
    weight_decay: float = 0.01
    token_weight: float = 0.5  # weight of the dense image-token loss (tinyvlm.labels)
    question_weight: float = 0.3  # weight of the language-model loss on the user's words
    # What each reference names, read after `referent_layer` text layers (tinyvlm.referents), and
    # first-layer heads that start as a window over the last `recency_window` tokens (0: off).
    referent_weight: float = 4.0
    referent_layer: int = 2
    pointer_weight: float = 1.0  # where one head per layer looks (tinyvlm.pointers)
    recency_window: float = 8.0
    recency_heads: tuple[int, ...] = (0, 1)
    # The vision tower's learning rate relative to the rest in the joint stage.
    vision_lr_scale: float = 0.3
    # A first stage that trains the vision tower alone on the image-token labels (cheap: 36 patches
    # a picture, no language model), so the language model reads useful features from its first step.
    vision_steps: int = 3600  # 1800 before 2026-12-05: doubling it lifted every eval row (notes 2026-12-05)
    vision_batch: int = 32
    vision_lr: float = 1e-3
    seed: int = 1234
    log_every: int = 25
    save_every: int = 200
    workers: int = 2
    stop_after: int | None = None  # cut the joint stage short (and leave the polish out)
    curriculum: bool = True
    # A last joint stage at a low learning rate on pictures that repeat colours and shapes, with the
    # answer, question and pointer losses only (tinyvlm.train: polish).
    polish_steps: int = 600
    polish_examples: int = 4000
    polish_lr: float = 6e-4
    polish_repeat: float = 0.3  # chance that an object copies an earlier one's colour or shape
    polish_seed: int = 1235  # not the joint stage's seed: new pictures
    # The image-token labels' loss in the polish (0: answers only, the recipe before 2026-12-05). At the
    # joint stage's weight the vision tower keeps learning the picture while the answers are polished.
    polish_token_weight: float = 0.5
    # The text layers' attention: "pointer-layers" (the committed weights since b9780c1e): eager only
    # in the two the pointer loss reads, SDPA in the rest (tinyvlm.attention; ~7 % less CPU a joint
    # step), or "eager" in all of them (the recipe before; other floats, so other weights).
    attention: Literal["eager", "pointer-layers"] = "pointer-layers"
    # The weight of "I can't tell" questions in the joint stage's and the polish's conversations
    # (None: dialogue.TRAINING's, 1.2). Notes 2026-12-05-cheaper-recipe.md: 0.6 then 1.2 cut false
    # refusals to unseen wordings (held_out_families 86.3 -> 90.5).
    unknown_weight: float | None = 0.6
    polish_unknown_weight: float | None = 1.2


HEADS_FILE = "aux_heads.safetensors"  # OUT/joint: the training-only heads (not part of the model)

SMOKE = TrainConfig(
    examples=48,
    steps=6,
    batch=8,
    warmup=2,
    log_every=2,
    curriculum=False,
    vision_steps=4,
    vision_batch=8,
    polish_steps=2,
    polish_examples=16,
)


def batches(n: int, steps: int, cfg: TrainConfig, offset: int = 0) -> list[list[int]]:
    """Index batches (into one phase's data, shifted by ``offset``): reshuffled each epoch from the
    seed, so runs repeat exactly."""
    rng = random.Random(cfg.seed + offset)
    order: list[int] = []
    while len(order) < steps * cfg.batch:
        epoch = list(range(offset, offset + n))
        rng.shuffle(epoch)
        order.extend(epoch)
    return [order[i * cfg.batch : (i + 1) * cfg.batch] for i in range(steps)]


def load_data(cfg: TrainConfig, cache_dir: Path) -> tuple[list[data.Example], list[list[int]]]:
    """All phases' examples in one list, and the index batch for every step."""
    phases = CURRICULUM if cfg.curriculum else (Phase(0.0, 0, TRAIN_SPEC, ""),)
    examples: list[data.Example] = []
    plan: list[list[int]] = []
    for k, phase in enumerate(phases):
        n = phase.examples or cfg.examples
        spec = replace(phase.spec, unknown_weight=cfg.unknown_weight)
        part = data.load_or_generate(n, cfg.seed, cache_dir, cfg.workers, spec, phase.tag)
        end = phases[k + 1].start if k + 1 < len(phases) else 1.0
        steps = round(end * cfg.steps) - round(phase.start * cfg.steps)
        plan.extend(batches(len(part), steps, cfg, offset=len(examples)))
        examples.extend(part)
    return examples, plan


def answer_accuracy(logits: torch.Tensor, labels: torch.Tensor) -> float:
    """Share of answer tokens predicted right (next-token, teacher-forced)."""
    pred, gold = logits[:, :-1].argmax(-1), labels[:, 1:]
    mask = gold != data.IGNORE
    return float((pred[mask] == gold[mask]).float().mean()) if mask.any() else 0.0


def param_groups(
    model: Glm4vForConditionalGeneration, heads: torch.nn.Module, cfg: TrainConfig
) -> list[dict]:
    vision = list(model.model.visual.parameters())
    seen = {id(p) for p in vision}
    rest = [p for p in model.parameters() if id(p) not in seen] + list(heads.parameters())
    return [
        {"params": vision, "scale": cfg.vision_lr_scale, "lr": cfg.lr * cfg.vision_lr_scale},
        {"params": rest, "scale": 1.0, "lr": cfg.lr},
    ]


def _log_row(step: int, out: objective.StepOutput, started: float) -> dict[str, float]:
    return {
        "step": step,
        "loss": round(out.loss.item(), 4),
        "answer_loss": round(out.answer_loss.item(), 4),
        "question_loss": round(out.question_loss.item(), 4),
        "token_loss": round(out.token_loss.item(), 4),
        "referent_loss": round(out.referent_loss.item(), 4),
        "pointer_loss": round(out.pointer_loss.item(), 4),
        "answer_token_acc": round(answer_accuracy(out.logits.detach(), out.labels), 4),
        "elapsed_s": round(time.time() - started, 1),
        "cpu_s": round(time.process_time(), 1),  # this process's CPU (the data workers' not included)
    }


def vision_stage(
    model: Glm4vForConditionalGeneration,
    heads: objective.TokenHeads,
    examples: list[data.Example],
    processor: Any,
    cfg: TrainConfig,
) -> None:
    """Train the vision tower and the token heads alone on the image-token labels."""
    rng = random.Random(cfg.seed)

    def step_loss() -> torch.Tensor:
        batch = data.collate_images(rng.sample(examples, min(cfg.vision_batch, len(examples))), processor)
        return heads.loss(objective.image_features(model, batch), batch["token_labels"])

    def report(step: int, loss: float) -> None:
        print(f"vision stage: step {step} token loss {loss:.3f}", flush=True)

    params = [*model.model.visual.parameters(), *heads.parameters()]
    began_wall, began_cpu = time.time(), time.process_time()
    fit(params, cfg.vision_steps, cfg.vision_lr, step_loss, report)
    wall, cpu = time.time() - began_wall, time.process_time() - began_cpu
    print(f"vision stage: {cfg.vision_steps} steps in {wall:.0f} s wall, {cpu:.0f} s CPU", flush=True)


def load_polish(cfg: TrainConfig, cache_dir: Path) -> tuple[list[data.Example], list[list[int]]]:
    """The polish stage's examples (its own seed: new pictures) and its index batches."""
    spec = replace(
        TRAIN_SPEC, repeat=cfg.polish_repeat, drills=True, unknown_weight=cfg.polish_unknown_weight
    )
    seed = cfg.polish_seed
    examples = data.load_or_generate(
        cfg.polish_examples, seed, cache_dir, cfg.workers, spec, f"-polish-r{cfg.polish_repeat:g}"
    )
    return examples, batches(len(examples), cfg.polish_steps, replace(cfg, seed=seed))


class Loop:
    """Joint training stages: an optimiser per stage, one log and one step count for all stages
    (``elapsed_s`` counts from ``started``). ``oracle`` (``tinyvlm.oracle``) maps the image-token
    labels to the features the language model reads, in place of the vision tower."""

    def __init__(
        self,
        model: Glm4vForConditionalGeneration,
        heads: objective.TokenHeads,
        processor: Any,
        cfg: TrainConfig,
        log: Any,
        out: Path,
        started: float,
        oracle: torch.nn.Module | None = None,
    ) -> None:
        self.model, self.heads, self.processor, self.cfg = model, heads, processor, cfg
        self.log, self.out, self.started, self.oracle = log, out, started, oracle
        self.step = 0

    def run(
        self,
        examples: list[data.Example],
        plan: list[list[int]],
        weights: objective.Weights,
        peak_lr: float,
        steps: int,
        name: str,
    ) -> None:
        """``plan``'s batches of ``examples``, the learning rate warming up to ``peak_lr`` and falling
        by a cosine over ``steps`` (the stage's full length, which ``plan`` may cut short)."""
        cfg, model = self.cfg, self.model
        params = [*model.parameters(), *self.heads.parameters()]
        optimizer = torch.optim.AdamW(
            param_groups(model, self.heads, cfg), betas=(0.9, 0.95), weight_decay=cfg.weight_decay
        )
        pad_id = self.processor.tokenizer.pad_token_id
        bar = tqdm(plan, desc=name, unit="step")
        for step, idx in enumerate(bar):
            lr = lr_at(step, peak_lr, steps, cfg.warmup)
            for group in optimizer.param_groups:
                group["lr"] = lr * group["scale"]
            batch = data.collate([examples[i] for i in idx], self.processor, pad_id)
            features = None if self.oracle is None else self.oracle(batch["token_labels"])
            output = objective.step(model, self.heads, batch, weights, features)
            output.loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if step % cfg.log_every == 0 or step == steps - 1:
                row = {"stage": name, "stage_step": step, "lr": lr}
                row |= _log_row(self.step, output, self.started)
                self.log.write(json.dumps(row) + "\n")
                self.log.flush()
                bar.set_postfix(loss=row["answer_loss"], tok=row["token_loss"], acc=row["answer_token_acc"])
            self.step += 1
            if self.step % cfg.save_every == 0:
                build.save_checkpoint(model, self.processor, self.out)  # usable if the run is cut short


def train(
    cfg: TrainConfig,
    out: Path,
    cache_dir: Path,
    init: Path | None = None,
    oracle: torch.nn.Module | None = None,
) -> Path:
    """Train and save vlmq-tiny. ``oracle`` (``tinyvlm.oracle``) maps the image-token labels to the
    features the language model reads, in place of the vision tower, and trains with it."""
    started = time.time()
    torch.manual_seed(cfg.seed)
    processor = build.build_processor()
    model = build.build_model(processor.tokenizer, seed=cfg.seed)
    if init is not None:  # continue from a checkpoint (same config)
        model.load_state_dict(Glm4vForConditionalGeneration.from_pretrained(init).state_dict())
    linear_patch_embed(model)
    if cfg.recency_window and init is None:  # an init of the weights, not of a checkpoint
        referents.recency_heads(model, cfg.recency_heads, cfg.recency_window)
    heads = objective.TokenHeads(objective.text_hidden_size(model))
    if cfg.referent_weight:
        heads.add_module("referents", referents.ReferentHead(objective.text_hidden_size(model)))
    if init is not None and (init / HEADS_FILE).exists():  # a full run's joint stage: its heads too
        heads.load_state_dict(load_file(init / HEADS_FILE))
    if oracle is not None:
        heads.add_module("oracle", oracle)  # its weights train with the language model's
    examples, plan = load_data(cfg, cache_dir) if cfg.steps else ([], [])  # 0: polish an --init only
    if examples:
        stats = data.token_stats(examples)
        print(f"data: {len(examples)} conversations in {time.time() - started:.0f}s {stats}")
    if cfg.vision_steps and cfg.steps and oracle is None:  # on the last phase's pictures (the full mix)
        vision_stage(model, heads, examples[-cfg.examples :], processor, cfg)
    weights = objective.Weights(
        cfg.token_weight, cfg.question_weight, cfg.referent_weight, cfg.referent_layer, cfg.pointer_weight
    )
    if cfg.pointer_weight:  # the pointer loss reads attention weights, which only eager attention returns
        pointer_only = cfg.attention == "pointer-layers"
        model.model.language_model.set_attn_implementation(attention.NAME if pointer_only else "eager")
    out.mkdir(parents=True, exist_ok=True)
    model.train()
    with (out / "train_log.jsonl").open("w") as log:
        loop = Loop(model, heads, processor, cfg, log, out, started, oracle)
        loop.run(examples, plan[: cfg.stop_after], weights, cfg.lr, cfg.steps, "train")
        if cfg.polish_steps and cfg.stop_after is None:
            if cfg.steps:  # the joint stage's weights: a start for polish-only runs (--init out/joint)
                build.save_checkpoint(model, processor, out / "joint")
                # the auxiliary heads as well: the polish's token loss reads them
                heads_state = {k: v.contiguous() for k, v in heads.state_dict().items()}
                save_file(heads_state, out / "joint" / HEADS_FILE)
            polish_examples, polish_plan = load_polish(cfg, cache_dir)
            # The referent head's labels are learnt by now; the image-token loss stays at its polish weight.
            polish = replace(weights, token=cfg.polish_token_weight, referent=0.0)
            loop.run(polish_examples, polish_plan, polish, cfg.polish_lr, cfg.polish_steps, "polish")
    model.eval()
    build.save_checkpoint(model, processor, out)
    print(f"saved {out} after {time.time() - started:.0f}s")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--smoke", action="store_true", help="tiny run for CI (< 60 s)")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--cache-dir", type=Path, default=Path("runs/cache"))
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--stop-after", type=int, default=None, help="cut the joint stage short, no polish")
    parser.add_argument("--examples", type=int, default=None)
    parser.add_argument("--batch", type=int, default=None)
    parser.add_argument("--lr", type=float, default=None)
    parser.add_argument("--token-weight", type=float, default=None)
    parser.add_argument("--question-weight", type=float, default=None)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--vision-steps", type=int, default=None, help="steps of the vision-only stage")
    parser.add_argument("--polish-steps", type=int, default=None, help="steps of the last, polish stage")
    parser.add_argument("--polish-lr", type=float, default=None)
    parser.add_argument("--polish-repeat", type=float, default=None)
    parser.add_argument("--polish-examples", type=int, default=None)
    parser.add_argument("--polish-token-weight", type=float, default=None, help="image-token loss, polish")
    parser.add_argument("--polish-seed", type=int, default=None, help="draws the polish set and its order")
    parser.add_argument(
        "--attention", choices=("eager", "pointer-layers"), default=None, help="text layers' attention"
    )
    parser.add_argument("--unknown-weight", type=float, default=None, help="'I can't tell' share, joint")
    parser.add_argument("--polish-unknown-weight", type=float, default=None, help="the same, polish")
    parser.add_argument("--init", type=Path, default=None, help="start from this checkpoint's weights")
    parser.add_argument("--no-curriculum", action="store_true", help="full distribution from step 0")
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads (1: the committed weights'; each count its own)"
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    out = args.out or Path("runs/vlmq-tiny-smoke" if args.smoke else "runs/vlmq-tiny")
    names = [
        "steps",
        "stop_after",
        "examples",
        "batch",
        "lr",
        "token_weight",
        "question_weight",
        "seed",
        "vision_steps",
        "polish_steps",
        "polish_lr",
        "polish_repeat",
        "polish_examples",
        "polish_seed",
        "polish_token_weight",
        "attention",
        "unknown_weight",
        "polish_unknown_weight",
    ]
    overrides = {k: getattr(args, k) for k in names if getattr(args, k) is not None}
    if args.no_curriculum:
        overrides["curriculum"] = False
    cfg = replace(SMOKE if args.smoke else TrainConfig(), **overrides)
    train(cfg, out, args.cache_dir, init=args.init)


if __name__ == "__main__":
    main()
