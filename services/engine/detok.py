"""Incremental detokenization with stop strings.

Text is re-decoded from all output ids each step (outputs are short; the Rust tokenizer is fast), which
keeps multi-byte characters and merges right. A trailing replacement character (incomplete UTF-8) and
any tail that could still grow into a stop string are held back until they resolve.
"""

from __future__ import annotations

from typing import Any


class Detokenizer:
    def __init__(self, tokenizer: Any, stop: tuple[str, ...]) -> None:
        self.tokenizer = tokenizer
        self.stop = tuple(s for s in stop if s)
        self.hold = max((len(s) for s in self.stop), default=1) - 1
        self.emitted = 0  # characters of text already handed out
        self.text = ""

    def step(self, output_ids: list[int], final: bool) -> tuple[str, bool]:
        """Delta to emit for the current outputs, and whether a stop string ended the text."""
        text = self.tokenizer.decode(output_ids, skip_special_tokens=True)
        cut = self._find_stop(text)
        if cut is not None:
            return self._emit(text[:cut]), True
        if final:
            return self._emit(text.rstrip("\ufffd")), False
        safe = len(text.rstrip("\ufffd")) - self.hold
        return self._emit(text[: max(safe, self.emitted)]), False

    def _find_stop(self, text: str) -> int | None:
        start = max(0, self.emitted - self.hold)
        hits = [i for i in (text.find(s, start) for s in self.stop) if i >= 0]
        return min(hits) if hits else None

    def _emit(self, text: str) -> str:
        delta = text[self.emitted :]
        self.emitted = max(self.emitted, len(text))
        self.text = text
        return delta
