"""Who runs next. The rule, once:

1. Drop cancelled and expired sequences (waiting ones never run; running ones leave now).
2. Admit waiting sequences into free slots (``max_batch``) when the engine is idle (a lone request
   never waits; while other requests are being submitted, the engine waits for them up to
   ``batch_window``: ``Engine._join_wait``), when the waiters fill every free slot and at least
   ``min_free`` slots are free (each prefill stalls the running decodes it cannot take along: a
   slot freed alone waits for others rather than cost a prefill of one), or when the
   oldest has waited ``batch_window`` (an interactive one does not wait for it while only batch
   work runs): highest priority first (``GenerationRequest.priority``,
   0 before 1), oldest first within a priority; a sequence that has waited ``aging_s`` counts as priority 0.
   Batch-priority sequences (1, not aged) never hold the last ``max_batch // 4`` slots: an
   interactive arrival finds a free slot instead of waiting for a batch sequence to finish. And
   they are not admitted while an interactive sequence runs or waits: a prefill step may stall
   every decode, so batch prefills would delay the interactive sequence's tokens (they join once
   it ends, or once they have aged).
   Admitted sequences are prefilled together this step; the running sequences that would decode
   (3.) are offered to the same forward (``ScheduledBatch.decode``: the runner steps them in it while
   their padding stays within ``mix_padding_tokens``, else the prefill stalls them a step).
3. Otherwise decode the running sequences; batch-priority ones (not aged) pause while an
   interactive sequence runs (the runner parks their KV), and resume when it ends.

``batch_held`` (set by the service while an interactive job is anywhere in its pipeline) holds batch
work the same way with no interactive sequence here: it then runs only on what interactive work
leaves idle, still bounded by aging.

Aging and a bounded batch mean no request starves; deadlines are honoured in both queues.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from services.engine.api import FinishReason
from services.engine.sequence import Sequence, Status


@dataclass
class ScheduledBatch:
    prefill: list[Sequence] = field(default_factory=list)
    decode: list[Sequence] = field(default_factory=list)
    dropped: list[tuple[Sequence, FinishReason]] = field(default_factory=list)


class Scheduler:
    def __init__(self, max_batch: int, window_s: float, aging_s: float = 10.0, min_free: int = 1) -> None:
        self.max_batch = max_batch
        self.min_free = min(max(1, min_free), max_batch)  # see ``_admit``
        self.interactive_reserve = max_batch // 4  # slots batch-priority work leaves free
        self.window_s = window_s
        self.aging_s = aging_s
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.cancelled: set[str] = set()
        # interactive work is in flight elsewhere in the service (``Engine.hold_batch``): batch work
        # waits as if an interactive sequence ran here
        self.batch_held = False

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def cancel(self, request_id: str) -> None:
        self.cancelled.add(request_id)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> ScheduledBatch:
        batch = ScheduledBatch(dropped=self._drop(time.time()))
        now = time.monotonic()
        batch.prefill = self._admit(now)
        # with a prefill: the running rows that would step, offered to its forward (the runner mixes
        # them in where that pays; otherwise the prefill stalls them for a step)
        batch.decode = [s for s in self._stepped(now) if s not in batch.prefill]
        return batch

    def drop(self) -> ScheduledBatch:
        """Only step 1 (an engine that runs nothing more still ends cancelled and expired sequences)."""
        return ScheduledBatch(dropped=self._drop(time.time()))

    def finish(self, seq: Sequence) -> None:
        seq.status = Status.FINISHED
        if seq in self.running:
            self.running.remove(seq)

    def _drop(self, now_epoch: float) -> list[tuple[Sequence, FinishReason]]:
        dropped: list[tuple[Sequence, FinishReason]] = []
        for queue in (self.waiting, self.running):
            for seq in list(queue):
                reason = self._drop_reason(seq, now_epoch)
                if reason is not None:
                    queue.remove(seq)
                    seq.status = Status.FINISHED
                    dropped.append((seq, reason))
        self.cancelled -= {seq.id for seq, _ in dropped}
        return dropped

    def _drop_reason(self, seq: Sequence, now_epoch: float) -> FinishReason | None:
        if seq.id in self.cancelled:
            return FinishReason.CANCELLED
        return FinishReason.EXPIRED if seq.expired(now_epoch) else None

    def _rank(self, seq: Sequence, now: float) -> int:
        return 0 if now - seq.arrival >= self.aging_s else seq.request.priority

    def _admit(self, now: float) -> list[Sequence]:
        free = self.max_batch - len(self.running)
        if not self.waiting or free <= 0:
            return []
        ready = (
            not self.running
            or (len(self.waiting) >= free and free >= self.min_free)
            or now - self.waiting[0].arrival >= self.window_s
            or self._interactive_jumps_batch()
        )
        if not ready:
            return []
        chosen = self._choose(free, now)
        admitted = [seq for seq in self.waiting if seq in chosen]  # in arrival order
        for seq in admitted:
            self.waiting.remove(seq)
        for seq in admitted:
            seq.status = Status.RUNNING
            seq.admitted_at = now
        self.running.extend(admitted)
        return admitted

    def _stepped(self, now: float) -> list[Sequence]:
        """The running sequences to decode: batch-priority ones pause while an interactive one runs
        (each would lengthen its steps and its worker's and gateway's work per step), unless aged."""
        if not self.batch_held and all(seq.request.priority > 0 for seq in self.running):
            return list(self.running)
        return [seq for seq in self.running if self._rank(seq, now) == 0]

    def _interactive_jumps_batch(self) -> bool:
        """An interactive sequence waits while only batch work runs: the window gathers arrivals to
        share a prefill, which batch work never joins while it waits, so it would only delay it."""
        interactive = (seq.request.priority == 0 for seq in self.waiting)
        return any(interactive) and all(seq.request.priority > 0 for seq in self.running)

    def _interactive_present(self, now: float) -> bool:
        """An interactive sequence (priority 0 by request, not by age) runs or waits, or the batch
        work is held for one elsewhere."""
        return self.batch_held or any(seq.request.priority == 0 for seq in (*self.running, *self.waiting))

    def _choose(self, free: int, now: float) -> list[Sequence]:
        """Up to ``free`` waiting sequences by rank, then age; batch ones only outside the reserve."""
        batch_room = self.max_batch - self.interactive_reserve
        batch_room -= sum(seq.request.priority > 0 for seq in self.running)
        if self._interactive_present(now):
            batch_room = 0
        chosen: list[Sequence] = []
        for seq in sorted(self.waiting, key=lambda seq: (self._rank(seq, now), seq.arrival)):
            if len(chosen) == free:
                break
            if self._rank(seq, now) > 0:
                if batch_room <= 0:
                    continue
                batch_room -= 1
            chosen.append(seq)
        return chosen
