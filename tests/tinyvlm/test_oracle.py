"""The perfect-vision diagnostic: answer scoring, label features, and the command's smoke run."""

import json
import subprocess
import sys
from pathlib import Path

import torch

from tinyvlm import data, labels
from tinyvlm.oracle import LabelFeatures, answers_right

ROOT = Path(__file__).resolve().parents[2]
SKIP = data.IGNORE


def test_an_answer_counts_only_when_every_token_of_it_is_right() -> None:
    gold = torch.tensor([SKIP, 5, 6, 2, SKIP, SKIP, 7, 2, SKIP, 8, 2])
    predicted = torch.tensor([0, 5, 6, 2, 9, 9, 7, 3, 0, 8, 2])
    assert answers_right(predicted, gold) == [True, False, True]


def test_label_features_tell_tokens_apart_by_every_column() -> None:
    features = LabelFeatures(hidden=16)
    base = torch.zeros(1, len(labels.COLUMNS), dtype=torch.long)
    rows = [base]
    for column in range(len(labels.COLUMNS)):
        changed = base.clone()
        changed[0, column] = 1
        rows.append(changed)
    out = features(torch.cat(rows))
    assert out.shape == (len(rows), 16)
    assert torch.cdist(out, out).fill_diagonal_(1.0).min() > 0  # all distinct


def test_oracle_smoke_writes_per_type_scores(tmp_path: Path) -> None:
    out = tmp_path / "oracle"
    cmd = [sys.executable, "-m", "tinyvlm.oracle", "--smoke", "--out", str(out)]
    cmd += ["--cache-dir", str(tmp_path)]
    subprocess.run(cmd, cwd=ROOT, check=True, timeout=120, capture_output=True)
    result = json.loads((out / "oracle.json").read_text())
    assert result["steps"] == 6
    assert {"overall", "colour", "shape"} <= set(result)
    assert all(0.0 <= v <= 100.0 for k, v in result.items() if k != "steps")
