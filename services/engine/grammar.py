"""Structured output: JSON decoded under a grammar, per sequence, inside the batched sampler.

xgrammar (chosen by measurement: README "Structured output", ``bench/grammar_libs.py``) compiles a
JSON Schema against the model's token table, once per distinct schema (its compiler caches by
schema text); each constrained sequence holds its own ``GrammarMatcher``. Every step the allowed
tokens of the constrained rows are filled into one bitmask and unpacked to a bool mask per row;
the sampler picks only among them, and free rows of the same batch are left as they are.

Beyond the grammar, a constrained row never gets a special token (but EOS, which the grammar allows
only once the JSON is complete) nor a token holding a control character: xgrammar reads special
tokens' names as text and lets raw control bytes into strings, both of which break the JSON (the
detokenizer drops special tokens; ``json.loads`` refuses control characters). JSON is written
compactly (no whitespace), so a model cannot wander off into blank lines.
"""

from __future__ import annotations

import re
import threading
from typing import Any

import torch
import xgrammar as xgr

from services.engine.api import RequestRejected, StructuredOutput

ANY_OBJECT = '{"type": "object"}'
COMPILE_CACHE_BYTES = 64 * 1024 * 1024
SEPARATORS = (",", ":")
# xgrammar's log prefix ("[07:29:04] /project/cpp/json_schema_converter.cc:5088: ") and its C++ check
# ("Check failed: (val <= MAX) is false: "): its source, not the user's schema
NOISE = re.compile(r"^(\[[\d:]+\] \S+:\d+: )?(Check failed: .*? is false: )?")


class Grammars:
    """The model's token table for xgrammar, the compiler, and the tokens no JSON output may hold."""

    def __init__(self, tokenizer: Any, vocab_size: int, eos_ids: frozenset[int]) -> None:
        info = xgr.TokenizerInfo.from_huggingface(
            tokenizer, vocab_size=vocab_size, stop_token_ids=sorted(eos_ids)
        )
        self.vocab_size = vocab_size
        self._compiler = xgr.GrammarCompiler(info, max_threads=1, cache_limit_bytes=COMPILE_CACHE_BYTES)
        self.never = _never_mask(info.decoded_vocab, _special_ids(tokenizer) - eos_ids, vocab_size)
        self._shifts = torch.arange(32, dtype=torch.int32)

    def matcher(self, structured: StructuredOutput) -> Any:
        """A fresh matcher for one sequence; RequestRejected when the schema does not compile."""
        schema = ANY_OBJECT if structured.kind == "json_object" else structured.schema
        if structured.kind not in ("json_object", "json_schema") or not schema:
            raise RequestRejected(f"structured output: unknown kind {structured.kind!r} or no schema")
        try:
            compiled = self._compiler.compile_json_schema(schema, any_whitespace=False, separators=SEPARATORS)
        except Exception as exc:  # xgrammar raises RuntimeError (and its own types) with the reason
            raise RequestRejected(
                f"response format: the JSON schema cannot be used: {reason_of(exc)}"
            ) from exc
        return xgr.GrammarMatcher(compiled)

    def allowed(self, matchers: list[Any | None], device: torch.device) -> list[torch.Tensor | None]:
        """Per row: a bool (V,) mask of the tokens its grammar allows next, or None (a free row)."""
        rows = [i for i, m in enumerate(matchers) if m is not None]
        out: list[torch.Tensor | None] = [None] * len(matchers)
        if not rows:
            return out
        bitmask = xgr.allocate_token_bitmask(len(rows), self.vocab_size)
        for k, i in enumerate(rows):
            matcher: Any = matchers[i]
            matcher.fill_next_token_bitmask(bitmask, k)
        bits = ((bitmask.unsqueeze(-1) >> self._shifts) & 1).bool().view(len(rows), -1)
        masks = (bits[:, : self.vocab_size] & ~self.never).to(device)
        for k, i in enumerate(rows):
            out[i] = masks[k]
        return out


def reason_of(exc: Exception) -> str:
    """xgrammar's reason for refusing a schema, as the user may read it: its last line, without the
    C++ source it names."""
    reason = NOISE.sub("", (str(exc).strip().splitlines() or [""])[-1], count=1)
    return reason.strip() or type(exc).__name__


class LazyGrammars:
    """Built on the first structured request (the token table costs a little; most engines never
    see one), then shared by every thread that submits."""

    def __init__(self, tokenizer: Any, vocab_size: int, eos_ids: frozenset[int]) -> None:
        self._args = (tokenizer, vocab_size, eos_ids)
        self._lock = threading.Lock()
        self._grammars: Grammars | None = None

    def get(self) -> Grammars:
        with self._lock:
            if self._grammars is None:
                self._grammars = Grammars(*self._args)
            return self._grammars


def _special_ids(tokenizer: Any) -> set[int]:
    ids = set(getattr(tokenizer, "all_special_ids", []) or [])
    decoder = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    return ids | {int(i) for i, token in decoder.items() if getattr(token, "special", False)}


def _never_mask(decoded_vocab: list[bytes], special: set[int], vocab_size: int) -> torch.Tensor:
    """True for the tokens a JSON output never holds: special ones and those with control bytes."""
    never = torch.zeros(vocab_size, dtype=torch.bool)
    for i, raw in enumerate(decoded_vocab[:vocab_size]):
        if i in special or any(b < 0x20 for b in raw):
            never[i] = True
    return never
