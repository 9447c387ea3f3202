"""Vision prefetch: encode a queued request's images on a side thread while the engine thread runs
the batch's forwards, so image encoding overlaps decoding (another core on CPU) instead of stalling
the prefill step that admits the request.

Hand-over rule, per sequence (``Sequence.vision_state``, changed under one lock):
``pending`` -> ``running`` -> ``done`` when the prefetcher gets there first, or ``pending`` ->
``inline`` when the runner needs the features before that (it then encodes them itself). A runner
that finds ``running`` waits for ``done``. Features land in ``Sequence.features`` (never in the
image cache: the runner owns cache writes and hit/miss counting). Images already in the image
cache are skipped. A failure here is not reported: the runner recomputes inline and fails properly.
"""

from __future__ import annotations

import logging
import queue
import threading

import torch

from services.engine.api import ImageInput
from services.engine.architectures import Architecture
from services.engine.caches import ImageCache
from services.engine.sequence import Sequence, Status

log = logging.getLogger(__name__)


class VisionPrefetcher:
    def __init__(self, arch: Architecture, image_cache: ImageCache | None) -> None:
        self.arch = arch
        self.image_cache = image_cache
        self._lock = threading.Lock()
        self._queue: queue.SimpleQueue[Sequence | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="vlmq-vision", daemon=True)
        self._thread.start()

    def add(self, seq: Sequence) -> None:
        if seq.request.images:
            self._queue.put(seq)

    def claim(self, seq: Sequence) -> None:
        """Before prefill: take the work if not started; wait for it if it is running."""
        with self._lock:
            state = seq.vision_state
            if state == "pending":
                seq.vision_state = "inline"
        if state == "running":
            seq.vision_done.wait()

    def stop(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while (seq := self._queue.get()) is not None:
            with self._lock:
                if seq.vision_state != "pending" or seq.status is Status.FINISHED:
                    continue
                seq.vision_state = "running"
            try:
                seq.features = self._encode(seq)
            except Exception:  # the runner encodes inline and reports the error
                log.debug("vision prefetch failed for %s", seq.id, exc_info=True)
            finally:
                seq.vision_state = "done"
                seq.vision_done.set()

    def _encode(self, seq: Sequence) -> dict[str, torch.Tensor]:
        todo: dict[str, ImageInput] = {}
        for span in seq.prompt.spans:
            cached = self.image_cache is not None and self.image_cache.peek(span.digest) is not None
            if not cached and span.digest not in todo:
                todo[span.digest] = seq.request.images[span.index]
        if not todo:
            return {}
        return dict(zip(todo, self.arch.encode_images(list(todo.values())), strict=True))
