"""Tokenizer reproducibility, label masking, and the training smoke run (`--smoke`)."""

import json
import subprocess
import sys
from pathlib import Path

import torch
from transformers import AutoProcessor

from tinyvlm import data
from tinyvlm.tokenizer import CHAT_TEMPLATE, build_tokenizer

ROOT = Path(__file__).resolve().parents[2]


def test_tokenizer_matches_committed_checkpoint() -> None:
    committed = json.loads((ROOT / "models" / "vlmq-tiny" / "tokenizer.json").read_text())
    rebuilt = json.loads(build_tokenizer().backend_tokenizer.to_str())
    assert rebuilt["model"]["vocab"] == committed["model"]["vocab"]
    assert rebuilt["model"]["merges"] == committed["model"]["merges"]


def test_chat_template_puts_a_messages_pictures_before_its_text() -> None:
    """The shipped template is the builder's, and renders [question, picture] as [picture, question]
    (the only layout the model was trained on); several pictures keep their order, texts theirs."""
    shipped = ROOT / "models" / "vlmq-tiny"
    assert (shipped / "chat_template.jinja").read_text() == CHAT_TEMPLATE
    processor = AutoProcessor.from_pretrained(shipped)

    def render(parts: list[dict[str, str]]) -> str:
        messages = [{"role": "user", "content": parts}]
        return str(processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))

    image, question = {"type": "image"}, {"type": "text", "text": "What colour is it?"}
    assert render([question, image]) == render([image, question])
    assert render([question, image]).endswith("<|end_of_image|>What colour is it?<|assistant|>")
    interleaved = [{"type": "text", "text": "A:"}, image, {"type": "text", "text": " B:"}, image]
    assert render(interleaved).endswith("<|end_of_image|>A: B:<|assistant|>")
    assert render(interleaved).count("<|begin_of_image|><|image|><|end_of_image|>") == 2


def test_labels_cover_answers_and_eos_only() -> None:
    tok = build_tokenizer()
    assistant, eos = tok.convert_tokens_to_ids("<|assistant|>"), tok.eos_token_id
    assert isinstance(assistant, int) and isinstance(eos, int)
    ids = torch.tensor(
        tok("<|user|>Hi<|assistant|>red<|endoftext|><|user|>And?<|assistant|>big<|endoftext|>")["input_ids"]
    )
    labels = data.assistant_labels(ids, assistant, eos)
    kept = ids[labels != data.IGNORE]
    assert tok.decode(kept) == "red<|endoftext|>big<|endoftext|>"


def test_train_smoke(tmp_path: Path) -> None:
    out = tmp_path / "smoke"
    cmd = [sys.executable, "-m", "tinyvlm.train", "--smoke", "--out", str(out), "--cache-dir", str(tmp_path)]
    subprocess.run(cmd, cwd=ROOT, check=True, timeout=60, capture_output=True)
    rows = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    joint = [row for row in rows if row["stage"] == "train"]
    assert joint and joint[-1]["loss"] < joint[0]["loss"]
    polish = [row for row in rows if row["stage"] == "polish"]
    assert polish and polish[0]["step"] == joint[-1]["step"] + 1  # one log, steps counted on
    assert (out / "model.safetensors").exists() and (out / "processor_config.json").exists()
    # The polish stage alone on the joint stage's weights writes the full run's own bytes.
    again = tmp_path / "polish-only"
    alone = ["--init", str(out / "joint"), "--steps", "0", "--vision-steps", "0", "--out", str(again)]
    polish = [*cmd[:-4], *alone, "--cache-dir", str(tmp_path)]
    subprocess.run(polish, cwd=ROOT, check=True, timeout=60, capture_output=True)
    assert (again / "model.safetensors").read_bytes() == (out / "model.safetensors").read_bytes()


def test_train_module_imports_on_its_own() -> None:
    subprocess.run([sys.executable, "-c", "import tinyvlm.train"], cwd=ROOT, check=True, timeout=60)
