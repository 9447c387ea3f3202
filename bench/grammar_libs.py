"""Which grammar library for structured output: ``python -m bench.grammar_libs``.

Measures xgrammar, llguidance and outlines-core on the bundled model's tokenizer (byte-level BPE,
631 tokens), whichever of them are importable (only xgrammar is a dependency; the others were
installed aside for the comparison: ``pip install --target DIR llguidance==1.9.1
outlines-core==0.2.14`` and ``PYTHONPATH=DIR``):

- setup per batch of 8 requests (compile the schema, make 8 matchers), and CPU cost per token at
  batch 8 (fill the 8 rows' masks, apply them to the logits, accept the 8 tokens), teacher-forced
  on valid documents so every library walks the same states;
- which JSON Schema keywords compile.

Results: a table on stdout and ``bench/results/grammar_libs.json``. The choice and its figures are
in README "Structured output".
"""

from __future__ import annotations

import importlib.util
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from transformers import AutoTokenizer

from bench.common import bundled_model_path

RESULTS = Path(__file__).resolve().parent / "results"
BATCH, ROUNDS = 8, 20
COLOURS = ["red", "green", "blue", "yellow", "orange", "purple", "pink", "cyan"]
SCHEMAS: dict[str, Any] = {
    "enum": {"type": "object", "properties": {"colour": {"enum": COLOURS}}, "required": ["colour"]},
    "nested": {
        "type": "object",
        "properties": {
            "shape": {"enum": ["circle", "square", "triangle", "star", "cross"]},
            "count": {"type": "integer", "minimum": 0, "maximum": 6},
            "size": {"type": "string", "maxLength": 12},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 3},
            "where": {
                "type": "object",
                "properties": {"row": {"type": "integer"}, "col": {"type": "integer"}},
            },
        },
        "required": ["shape", "count", "size", "tags", "where"],
        "additionalProperties": False,
    },
    "json_object": {"type": "object"},
}
DOCS = {
    "enum": ['{"colour":"red"}', '{"colour":"purple"}'],
    "nested": ['{"shape":"star","count":3,"size":"big","tags":["left","top"],"where":{"row":1,"col":2}}'],
    "json_object": ['{"answer":"red","confidence":0.9,"objects":[{"shape":"star"},{"shape":"circle"}]}'],
}
FEATURES: dict[str, Any] = {
    "anyOf": {"anyOf": [{"type": "integer"}, {"type": "string"}]},
    "allOf": {"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}}, {"required": ["a"]}]},
    "$ref recursion": {"$defs": {"n": {"type": "array", "items": {"$ref": "#/$defs/n"}}}, "$ref": "#/$defs/n"},  # noqa: E501
    "pattern": {"type": "string", "pattern": "^[a-z]+[0-9]?$"},
    "integer bounds": {"type": "integer", "minimum": 3, "maximum": 17},
    "string length": {"type": "string", "minLength": 2, "maxLength": 5},
    "format date-time": {"type": "string", "format": "date-time"},
    "invalid type (must fail)": {"type": "objectx"},
}  # fmt: skip


class Lib:
    """One library behind the same four calls: compile, new matcher, fill row, accept."""

    def __init__(self, tok: Any, vocab: int) -> None:
        self.tok, self.vocab = tok, vocab

    def alloc(self) -> torch.Tensor:
        return torch.zeros((BATCH, (self.vocab + 31) // 32), dtype=torch.int32)

    def apply(self, logits: torch.Tensor, bitmask: torch.Tensor) -> None:
        bits = ((bitmask.unsqueeze(-1) >> torch.arange(32, dtype=torch.int32)) & 1).bool().view(BATCH, -1)
        logits.masked_fill_(~bits[:, : self.vocab], float("-inf"))

    def compile(self, schema: Any) -> Any:
        raise NotImplementedError

    def matcher(self, grammar: Any) -> Any:
        raise NotImplementedError

    def fill(self, m: Any, bitmask: torch.Tensor, row: int) -> None:
        raise NotImplementedError

    def accept(self, m: Any, token: int) -> bool:
        raise NotImplementedError


class Xgrammar(Lib):
    def __init__(self, tok: Any, vocab: int) -> None:
        import xgrammar as xgr

        super().__init__(tok, vocab)
        self.x = xgr
        self.compiler = xgr.GrammarCompiler(xgr.TokenizerInfo.from_huggingface(tok, vocab_size=vocab))

    def compile(self, schema: Any) -> Any:
        return self.compiler.compile_json_schema(
            json.dumps(schema), any_whitespace=False, separators=(",", ":")
        )

    def matcher(self, grammar: Any) -> Any:
        return self.x.GrammarMatcher(grammar)

    def fill(self, m: Any, bitmask: torch.Tensor, row: int) -> None:
        m.fill_next_token_bitmask(bitmask, row)

    def accept(self, m: Any, token: int) -> bool:
        return bool(m.accept_token(token))


class Llguidance(Lib):
    def __init__(self, tok: Any, vocab: int) -> None:
        import llguidance
        import llguidance.hf
        import llguidance.torch

        super().__init__(tok, vocab)
        self.llg, self.lt = llguidance, llguidance.torch
        self.tokenizer = llguidance.hf.from_tokenizer(tok, n_vocab=vocab)

    def compile(self, schema: Any) -> Any:
        grammar = self.llg.LLMatcher.grammar_from_json_schema(json.dumps(schema))
        failed, messages = self.llg.LLMatcher.validate_grammar_with_warnings(grammar, self.tokenizer)
        if failed:
            raise ValueError(messages)
        return grammar

    def matcher(self, grammar: Any) -> Any:
        return self.llg.LLMatcher(self.tokenizer, grammar)

    def fill(self, m: Any, bitmask: torch.Tensor, row: int) -> None:
        self.lt.fill_next_token_bitmask(m, bitmask, row)

    def accept(self, m: Any, token: int) -> bool:
        return bool(m.consume_token(token))


class OutlinesCore(Lib):
    def __init__(self, tok: Any, vocab: int) -> None:
        from outlines_core import Guide, Index, Vocabulary
        from outlines_core.json_schema import build_regex_from_schema

        super().__init__(tok, vocab)
        self.Guide, self.Index, self.regex = Guide, Index, build_regex_from_schema
        self.vocabulary = Vocabulary(tok.eos_token_id, _byte_vocab(tok))

    def compile(self, schema: Any) -> Any:
        return self.Index(self.regex(json.dumps(schema)), self.vocabulary)

    def matcher(self, grammar: Any) -> Any:
        return self.Guide(grammar)

    def fill(self, m: Any, bitmask: torch.Tensor, row: int) -> None:
        m.write_mask_into(bitmask[row].data_ptr(), bitmask[row].numel(), 4)

    def accept(self, m: Any, token: int) -> bool:
        if token != self.tok.eos_token_id:
            m.advance(token)
        return True


def _byte_vocab(tok: Any) -> dict[bytes, list[int]]:
    """Byte-level BPE token strings -> their bytes (GPT-2's byte-to-unicode table, inverted)."""
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    extra = [b for b in range(256) if b not in printable]
    to_byte = {chr(b): b for b in printable} | {chr(256 + i): b for i, b in enumerate(extra)}
    vocab: dict[bytes, list[int]] = {}
    for text, i in tok.get_vocab().items():
        if i != tok.eos_token_id and not text.startswith("<|"):
            vocab.setdefault(bytes(to_byte[c] for c in text), []).append(i)
    return vocab


def cost(lib: Lib, schema: Any, docs: list[str]) -> dict[str, float]:
    """Setup ms per batch of 8 (compile + 8 matchers), and microseconds per token at batch 8."""
    seqs = [lib.tok(docs[i % len(docs)], add_special_tokens=False)["input_ids"] + [0] for i in range(BATCH)]
    setup = step = 0.0
    tokens = 0
    bitmask = lib.alloc()
    for r in range(ROUNDS):
        t = time.perf_counter()
        grammar = lib.compile({**schema, "description": f"round {r}"})  # a new schema each time
        matchers = [lib.matcher(grammar) for _ in range(BATCH)]
        setup += time.perf_counter() - t
        for k in range(max(map(len, seqs))):
            live = [i for i in range(BATCH) if k < len(seqs[i])]
            logits = torch.randn(BATCH, lib.vocab)
            t = time.perf_counter()
            for i in live:
                lib.fill(matchers[i], bitmask, i)
            lib.apply(logits, bitmask)
            for i in live:
                assert lib.accept(matchers[i], seqs[i][k])
            step += time.perf_counter() - t
            tokens += len(live)
    return {"setup_ms": 1000 * setup / ROUNDS, "us_per_token": 1e6 * step / tokens}


def features(lib: Lib) -> dict[str, str]:
    out = {}
    for name, schema in FEATURES.items():
        try:
            lib.compile(schema)
            out[name] = "compiles"
        except Exception as exc:
            out[name] = "refused: " + str(exc).strip().splitlines()[-1][:50]
    return out


LIBS: dict[str, tuple[str, Callable[[Any, int], Lib]]] = {
    "xgrammar": ("xgrammar", Xgrammar),
    "llguidance": ("llguidance", Llguidance),
    "outlines-core": ("outlines_core", OutlinesCore),
}


def main() -> None:
    torch.set_num_threads(1)
    tok = AutoTokenizer.from_pretrained(bundled_model_path())
    results: dict[str, Any] = {}
    for name, (module, make) in LIBS.items():
        if importlib.util.find_spec(module) is None:
            print(f"{name}: not installed, skipped")
            continue
        lib = make(tok, len(tok))
        results[name] = {
            "cost": {s: cost(lib, SCHEMAS[s], DOCS[s]) for s in SCHEMAS},
            "features": features(lib),
        }
        for schema, c in results[name]["cost"].items():
            setup, per_token = c["setup_ms"], c["us_per_token"]
            print(f"{name:14s} {schema:12s} setup {setup:8.2f} ms/8 requests  {per_token:8.1f} us/token")
        for feature, verdict in results[name]["features"].items():
            print(f"{name:14s} {feature:26s} {verdict}")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "grammar_libs.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
