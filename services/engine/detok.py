"""Incremental detokenization with stop strings.

New text comes from decoding a short window of recent tokens (``prefix_offset`` .. end) and keeping
what it adds beyond the window's already-read part, as vLLM does: O(1) per token, and merges or
leading-space rules of the tokenizer stay right because the window starts a few tokens back. Text
ending in an incomplete UTF-8 character is not confirmed until it resolves; a tail that could still
grow into a stop string is held back from the client until it cannot.
"""

from __future__ import annotations

from typing import Any


class Detokenizer:
    def __init__(self, tokenizer: Any, stop: tuple[str, ...]) -> None:
        self.tokenizer = tokenizer
        self.stop = tuple(s for s in stop if s)
        self.hold = max((len(s) for s in self.stop), default=1) - 1
        self.text = ""  # confirmed text of all output tokens so far
        self.emitted = 0  # characters of ``text`` handed out
        self.prefix_offset = 0  # window start: tokens before it are fully in ``text``
        self.read_offset = 0  # tokens before it are in ``text``

    def step(self, output_ids: list[int], final: bool, check_stop: bool = True) -> tuple[str, bool]:
        """Delta to emit for the current outputs, and whether a stop string ended the text
        (``check_stop`` False: not yet, the request's ``min_tokens`` are not reached)."""
        self.text += self._new_text(output_ids, final)
        cut = self._find_stop() if check_stop else None
        if cut is not None:
            return self._emit(cut), True
        if final:
            return self._emit(len(self.text)), False
        return self._emit(max(len(self.text) - self.hold, self.emitted)), False

    def _new_text(self, ids: list[int], final: bool) -> str:
        seen = self._decode(ids[self.prefix_offset : self.read_offset])
        full = self._decode(ids[self.prefix_offset :])
        if full.endswith("\ufffd") and not final:
            return ""  # an incomplete character: wait for the next token
        self.prefix_offset, self.read_offset = self.read_offset, len(ids)
        return full[len(seen) :].rstrip("\ufffd") if final else full[len(seen) :]

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True) if ids else ""

    def _find_stop(self) -> int | None:
        start = max(0, self.emitted - self.hold)
        hits = [i for i in (self.text.find(s, start) for s in self.stop) if i >= 0]
        return min(hits) if hits else None

    def _emit(self, upto: int) -> str:
        delta = self.text[self.emitted : upto]
        self.emitted = max(self.emitted, upto)
        return delta
