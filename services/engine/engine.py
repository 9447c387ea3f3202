"""The engine: a background thread running ``step() = schedule -> run -> postprocess``.

Callers on any thread ``submit`` requests and receive ``TokenEvent`` callbacks from the engine
thread; ``cancel`` and deadlines take effect at the next step. One model forward at a time, always
on the engine thread. ``submit`` makes only the checks that cost nothing (and compiles a structured
request's grammar); the engine thread renders and tokenizes the prompts of what was submitted before
each step, so a submitting thread never holds the GIL against the forwards (on a small CPU host the
contention cost more than the work), and a prompt it refuses ends with ``FinishReason.REJECTED``.

Faults stay small: a failed step fails its own sequences (a NaN/inf row only itself); only
``max_failed_steps`` failed steps in a row or a device error make the engine unhealthy, and an
unhealthy engine runs nothing more (its queued sequences wait for cancel or ``stop``).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import torch

from services.engine.api import FinishReason, GenerationRequest, RequestRejected, Timings, TokenEvent, Usage
from services.engine.architectures import Architecture, auto_max_batch
from services.engine.caches import ImageCache, PrefixCache, SessionCache
from services.engine.config import EngineConfig
from services.engine.detok import Detokenizer
from services.engine.grammar import LazyGrammars
from services.engine.prompt import PromptBuilder
from services.engine.runner import Caches, ModelRunner
from services.engine.sampling import is_greedy, make_generator, sample
from services.engine.scheduler import ScheduledBatch, Scheduler
from services.engine.sequence import Prompt, Sequence, Submission
from services.engine.stats import EngineStats
from services.engine.vision import VisionPrefetcher

log = logging.getLogger(__name__)
EventCallback = Callable[[TokenEvent], None]
Failed = list[tuple[Sequence, Exception]]  # sequences a step failed, and why
DEVICE_ERROR_MARKERS = ("CUDA error", "device-side assert", "CUBLAS_STATUS", "cuDNN error")
HELD_RECHECK_S = 0.02  # held batch work: how often an idle engine looks again (aging, deadlines)


class Engine:
    def __init__(self, model: Any, processor: Any, config: EngineConfig | None = None) -> None:
        self.config = config or EngineConfig()
        self.model = model.eval()
        self._processor = processor
        self.arch = Architecture(model, processor, lean=self.config.lean_forward)
        self.prompts = PromptBuilder(self.arch, processor, self.config)
        self.eos_ids = frozenset(self.arch.eos_token_ids())
        self._eos_order = tuple(sorted(self.eos_ids))
        self.grammars = LazyGrammars(self.arch.tokenizer, self.arch.vocab_size, self.eos_ids)
        max_batch = self.config.max_batch or auto_max_batch(self.arch, self.config.max_context_tokens)
        self.scheduler = Scheduler(
            max_batch,
            self.config.batch_window_ms / 1000.0,
            self.config.priority_aging_s,
            self.config.prefill_min_free or max(1, max_batch // 2),
        )
        self.runner = ModelRunner(
            self.arch, self._make_caches(), mix_padding_tokens=self.config.mix_padding_tokens
        )
        self._stats = EngineStats(max_batch=max_batch)
        self._cv = threading.Condition()
        self._submitted: list[Submission] = []  # accepted, prompts not yet rendered
        self._inbox: list[Sequence] = []  # rendered, not yet handed to the scheduler
        self._cancels: set[str] = set()
        self._forward_lock = threading.Lock()  # one forward at a time per model (step or prewarm)
        self._known: dict[str, GenerationRequest] = {}  # submitted and not yet finished
        self._batch_submitted = threading.Event()  # ``wait_for_batch_work``
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._healthy = True
        self._last_error: str | None = None
        self._step_listeners: list[Callable[[], None]] = []
        self._preparing = 0  # submit calls preparing requests right now (``_join_wait``)

    @classmethod
    def from_pretrained(cls, config: EngineConfig) -> Engine:
        from services.vlm.loading import load_model

        device = config.device
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        model, processor = load_model(config.model_path, config.quantize, device)
        return cls(model, processor, config)

    def _make_caches(self) -> Caches:
        c = self.config
        return Caches(
            prefix=PrefixCache(c.prefix_cache_bytes) if c.prefix_cache else None,
            session=SessionCache(c.session_cache_bytes, c.session_ttl_s) if c.session_cache else None,
            image=ImageCache(c.image_cache_bytes) if c.image_cache else None,
        )

    # --- properties -------------------------------------------------------------------------------
    @property
    def processor(self) -> Any:
        return self._processor

    @property
    def tokenizer(self) -> Any:
        return self.arch.tokenizer

    @property
    def image_processor(self) -> Any:
        return getattr(self._processor, "image_processor", None)

    @property
    def healthy(self) -> bool:
        return self._healthy

    @property
    def last_error(self) -> str | None:
        return self._last_error

    @property
    def caches(self) -> Caches:
        return self.runner.caches

    # --- lifecycle --------------------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is not None:
            return
        self._stopping = False
        if self.config.vision_prefetch:
            self.runner.prefetcher = VisionPrefetcher(self.arch, self.runner.caches.image)
        self._thread = threading.Thread(target=self._loop, name="vlmq-engine", daemon=True)
        self._thread.start()

    def stop(self, drain_timeout_s: float | None = None) -> None:
        """Stop admitting. ``None``: finish everything in flight; otherwise wait up to the timeout,
        then cancel what is left (at once when unhealthy). Returns when the engine thread has exited."""
        with self._cv:
            self._stopping = True
            self._cv.notify_all()
        deadline = None if drain_timeout_s is None else time.monotonic() + drain_timeout_s
        while self._thread is not None and self._thread.is_alive():
            # an unhealthy engine runs nothing more: what is left can only be cancelled
            if (deadline is not None and time.monotonic() >= deadline) or not self._healthy:
                for rid in list(self._known):
                    self.cancel(rid)
                deadline = None
            self._thread.join(timeout=0.05)
        self._thread = None
        if self.runner.prefetcher is not None:
            self.runner.prefetcher.stop()
            self.runner.prefetcher = None

    def prewarm(self) -> None:
        """Compute the KV of the default system prompt (the tokens every conversation starts with)."""
        if self.runner.caches.prefix is None:
            return
        a = self.prompts.tokenize([{"role": "user", "content": [{"type": "text", "text": "a"}]}])
        b = self.prompts.tokenize([{"role": "user", "content": [{"type": "text", "text": "b"}]}])
        n = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
        if n == 0:
            return
        prompt = Prompt(a[:n], self.arch.positions(a[:n], []), [])
        with self._forward_lock:
            entry = self.runner.compute_prefix(prompt)
            self.runner.caches.prefix.add(entry)

    # --- requests ---------------------------------------------------------------------------------
    def validate(self, request: GenerationRequest) -> None:
        self._prepare(request)

    def _prepare(self, request: GenerationRequest) -> tuple[Prompt, Any]:
        """Everything ``submit`` and the engine thread check, here at once: the prompt and the
        grammar matcher, or RequestRejected."""
        grammar = self._accept(request)
        try:
            return self.prompts.render(request), grammar
        except RequestRejected:
            self._count_rejected()
            raise

    def _accept(self, request: GenerationRequest) -> Any:
        """``submit``'s checks; the grammar matcher of a structured request (compiled here, on the
        caller's thread, never on the engine's)."""
        try:
            if self._stopping:
                raise RequestRejected("engine is stopping")
            if not request.request_id or request.request_id in self._known:
                raise RequestRejected(f"request_id {request.request_id!r} is empty or already in flight")
            self.prompts.check(request)
            structured = request.sampling.structured
            return self.grammars.get().matcher(structured) if structured else None
        except RequestRejected:
            self._count_rejected()
            raise

    def _count_rejected(self) -> None:
        with self._cv:  # submitting threads and the engine thread both count
            self._stats.rejected += 1

    def submit(self, request: GenerationRequest, on_event: EventCallback) -> None:
        (refused,) = self.submit_many([(request, on_event)])
        if refused is not None:
            raise refused

    def submit_many(
        self, items: list[tuple[GenerationRequest, EventCallback]]
    ) -> list[RequestRejected | None]:
        """Submit several requests at once: they reach the scheduler together, so an idle engine
        prefills them in one step. Per request: None (submitted) or why it was refused now; a
        submitted request whose prompt the engine thread then refuses (image tensors, the chat
        template, the context length) ends with a ``FinishReason.REJECTED`` event saying why.
        While requests are being submitted (here, on any thread), an idle engine holding others
        waits for them up to the admission window: requests that arrive together share a prefill."""
        outcome: list[RequestRejected | None] = [None] * len(items)
        accepted: list[tuple[int, Submission]] = []
        with self._cv:
            self._preparing += 1
        try:
            for i, (request, on_event) in enumerate(items):
                try:
                    accepted.append((i, Submission(request, on_event, self._accept(request))))
                except RequestRejected as exc:
                    outcome[i] = exc
            with self._cv:  # one block with the count: a waiting engine wakes to find them queued
                for i, sub in accepted:
                    outcome[i] = self._enqueue(sub)
        finally:
            with self._cv:
                self._preparing -= 1
                self._cv.notify_all()
        return outcome

    def _enqueue(self, sub: Submission) -> RequestRejected | None:
        """Queue an accepted request for rendering (under ``_cv``), or say why not after all."""
        rid = sub.request.request_id
        if self._stopping:  # stop() came while it was being accepted: the thread may be gone
            self._stats.rejected += 1
            return RequestRejected("engine is stopping")
        if rid in self._known:  # submitted meanwhile, or twice in this call
            self._stats.rejected += 1
            return RequestRejected(f"request_id {rid!r} already in flight")
        self._known[rid] = sub.request
        self._submitted.append(sub)
        self._stats.submitted += 1
        if sub.request.priority > 0:
            self._batch_submitted.set()
        return None

    def _sequence(self, sub: Submission) -> Sequence:
        request = sub.request
        return Sequence(
            request=request,
            prompt=self.prompts.render(request),
            on_event=sub.on_event,
            detok=Detokenizer(self.tokenizer, request.sampling.stop),
            eos_ids=self.eos_ids,
            arrival=sub.arrival,
            generator=None if is_greedy(request.sampling) else make_generator(request.sampling.seed),
            grammar=sub.grammar,
        )

    def _render_submitted(self) -> None:
        """Make the submitted requests sequences (on the engine thread, outside the lock: submitting
        threads are not held up); refuse those whose prompt does not pass."""
        with self._cv:
            subs, self._submitted = self._submitted, []
        if not subs:
            return
        started = time.thread_time()
        ready: list[Sequence] = []
        for sub in subs:
            try:
                ready.append(self._sequence(sub))
            except RequestRejected as exc:
                self._count_rejected()
                self._refuse(sub, FinishReason.REJECTED, str(exc))
            except Exception as exc:  # a bug in rendering: this request fails, the engine goes on
                log.exception("request %s: the prompt could not be prepared", sub.request.request_id)
                self._stats.errors += 1
                self._refuse(sub, FinishReason.ERROR, f"{type(exc).__name__}: {exc}")
        with self._cv:
            self._inbox.extend(ready)
        if self.runner.prefetcher is not None:
            for seq in ready:
                self.runner.prefetcher.add(seq)
        self._stats.prompt_cpu_s += time.thread_time() - started
        if len(ready) < len(subs):  # refusals were emitted: listeners flush them as after a step
            self._notify_step_listeners()

    def _refuse(self, sub: Submission, reason: FinishReason, error: str) -> None:
        with self._cv:
            self._stats.finished[reason.value] = self._stats.finished.get(reason.value, 0) + 1
            self._known.pop(sub.request.request_id, None)
        rid, waited = sub.request.request_id, Timings(queue=time.monotonic() - sub.arrival)
        self._emit_to(sub.on_event, rid, TokenEvent(rid, (), "", 0, reason, error, Usage(), waited))

    def add_step_listener(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` on the engine thread after every step, once the step's events were
        emitted (a writer can then send one step's events for every sequence together)."""
        self._step_listeners.append(listener)

    def cancel(self, request_id: str) -> bool:
        with self._cv:
            if request_id not in self._known:
                return False
            self._cancels.add(request_id)
            self._cv.notify_all()
            return True

    async def generate(self, request: GenerationRequest) -> AsyncIterator[TokenEvent]:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[TokenEvent] = asyncio.Queue()

        def on_event(ev: TokenEvent) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, ev)

        self.submit(request, on_event)
        done = False
        try:
            while not done:
                event = await queue.get()
                done = event.finished
                yield event
        finally:
            if not done:  # the consumer went away: free the slot
                self.cancel(request.request_id)

    def generate_sync(self, request: GenerationRequest, timeout_s: float | None = None) -> list[TokenEvent]:
        events: list[TokenEvent] = []
        done = threading.Event()

        def on_event(ev: TokenEvent) -> None:
            events.append(ev)
            if ev.finished:
                done.set()

        self.submit(request, on_event)
        if not done.wait(timeout_s):
            self.cancel(request.request_id)
            done.wait()
        return events

    def forget_counters(self) -> None:
        """Zero the counters (after a warm-up: the metrics count real work only)."""
        with self._cv:
            self._stats = EngineStats(max_batch=self._stats.max_batch)

    def stats(self) -> EngineStats:
        with self._cv:
            s = self._stats
            queued = len(self.scheduler.waiting) + len(self._inbox) + len(self._submitted)
            s.running, s.waiting = len(self.scheduler.running), queued
            s.healthy = self._healthy
            s.caches = {c.name: c.stats() for c in self.runner.caches.all()}
            return EngineStats(
                **{
                    **s.__dict__,
                    "batch_sizes": dict(s.batch_sizes),
                    "prefill_sizes": dict(s.prefill_sizes),
                    "finished": dict(s.finished),
                }
            )

    # --- the loop ---------------------------------------------------------------------------------
    def _loop(self) -> None:
        while self._next_work():
            if not self._healthy:  # a device error or too many failed steps: run nothing more
                self._park()
                continue
            started = time.thread_time()
            with self._forward_lock:
                batch = self.scheduler.schedule()
                try:
                    self.step(batch)
                except Exception as exc:  # a bug outside the forward: the batch state is unknown
                    log.exception("engine step failed")
                    self.runner.reset()
                    self._end_step([(seq, exc) for seq in self.scheduler.running], ran=False)
            self._stats.step_cpu_s += time.thread_time() - started
            self._notify_step_listeners()
            if not (batch.prefill or batch.decode or batch.dropped):
                self._wait_for_change()

    def _notify_step_listeners(self) -> None:
        for listener in self._step_listeners:
            listener()

    def _wait_for_change(self) -> None:
        """Nothing to step although work is here (held batch work): sleep until something changes
        (a submission, a cancel, the hold's end) or a held sequence may have aged in."""
        with self._cv:
            if not (self._submitted or self._inbox or self._cancels or self._stopping):
                self._cv.wait(timeout=HELD_RECHECK_S)

    def idle(self) -> bool:
        """No request in flight (submitted and not finished): one submitted now is rendered at once."""
        with self._cv:
            return not self._known

    def has_batch_work(self) -> bool:
        """A batch-priority request is submitted and not finished (only then can a hold matter)."""
        with self._cv:
            return any(request.priority > 0 for request in self._known.values())

    def wait_for_batch_work(self, timeout: float) -> bool:
        """``has_batch_work``, waiting up to ``timeout`` for a batch-priority submission when there is
        none (the batch hold sleeps here instead of polling while only interactive work comes)."""
        self._batch_submitted.clear()  # before the check: a submission after it sets it again
        if self.has_batch_work():
            return True
        self._batch_submitted.wait(timeout)
        return self.has_batch_work()

    def hold_batch(self, held: bool) -> None:
        """Hold batch-priority work (not aged) as if an interactive sequence ran: the service sets
        this while interactive jobs are in flight anywhere in its pipeline."""
        with self._cv:
            if self.scheduler.batch_held != held:
                self.scheduler.batch_held = held
                self._cv.notify_all()

    def _next_work(self) -> bool:
        """Render submissions (once a pass: a stream of them never holds up the running rows), hand
        them and cancels to the scheduler; wait while idle. False: stopped and idle."""
        while True:
            self._render_submitted()
            with self._cv:  # only hand-over under the lock; rendering and the step run without it
                self._hand_over()
                if self.scheduler.has_work():
                    wait = self._join_wait()
                    if wait <= 0:
                        return True
                    self._cv.wait(timeout=wait)  # others are being submitted right now: let them join
                    continue
                if self._submitted:  # came while rendering: render them now
                    continue
                if self._stopping:
                    return False
                self._cv.wait(timeout=1.0)

    def _hand_over(self) -> None:
        """Rendered sequences and cancels to the scheduler (under ``_cv``); a cancel of a request not
        rendered yet waits for the next pass, one of a request that ended already is dropped."""
        for seq in self._inbox:
            self.scheduler.add(seq)
        self._inbox.clear()
        pending = {sub.request.request_id for sub in self._submitted} if self._submitted else set()
        for rid in self._cancels - pending:
            if rid in self._known:
                self.scheduler.cancel(rid)
        self._cancels &= pending

    def _join_wait(self) -> float:
        """Seconds an idle engine waits before its first prefill: while other submissions are being
        prepared, up to the admission window since the oldest waiter arrived; else 0 (a lone request
        never waits). Called under ``_cv``."""
        s = self.scheduler
        if not self._preparing or s.running or not s.waiting or self._stopping:
            return 0.0
        return s.window_s - (time.monotonic() - s.waiting[0].arrival)

    def _park(self) -> None:
        """Unhealthy: queued sequences stay queued (the caller releases them elsewhere); cancels and
        deadlines still end them, and ``stop`` cancels the rest."""
        self._finish_dropped(self.scheduler.drop())
        with self._cv:
            if not self._cancels and not self._stopping:
                self._cv.wait(timeout=0.5)

    def step(self, batch: ScheduledBatch) -> None:
        """One engine step: drop what left, then run the batch, then postprocess its tokens."""
        self._finish_dropped(batch)
        seqs = batch.prefill or batch.decode
        if not seqs:
            return
        started = time.thread_time()
        logits, ran, failed = self._run(batch, seqs)
        self._stats.forward_cpu_s += time.thread_time() - started
        self._stats.steps += 1
        self._end_step(failed, ran=bool(ran))
        if ran:
            self._postprocess(ran, logits)

    def _finish_dropped(self, batch: ScheduledBatch) -> None:
        seqs = [s for s, _ in batch.dropped]
        self.runner.release(seqs, [False] * len(seqs))
        for seq, reason in batch.dropped:
            self._finish(seq, reason)

    def _run(
        self, batch: ScheduledBatch, seqs: list[Sequence]
    ) -> tuple[torch.Tensor, list[Sequence], Failed]:
        """(logits, the sequences they belong to, the sequences the runner failed and why)."""
        if batch.prefill:
            self._stats.prefill_steps += 1
            with self._cv:  # stats() copies these dicts under the same lock
                self._stats.prefill_sizes[len(seqs)] = self._stats.prefill_sizes.get(len(seqs), 0) + 1
            return self._prefill_isolated(seqs, batch.decode)
        self._stats.decode_steps += 1
        with self._cv:  # stats() copies these dicts under the same lock
            self._stats.batch_sizes[len(seqs)] = self._stats.batch_sizes.get(len(seqs), 0) + 1
        try:
            rows, logits = self.runner.decode(seqs)
            return logits, rows, []
        except Exception as exc:  # a failed decode leaves the stepped rows' KV undefined: they fail
            self.runner.reset(keep_parked=True)  # paused rows were not stepped: their KV stands
            lost = [seq for seq in self.scheduler.running if seq.id not in self.runner.parked.ids]
            return torch.empty(0), [], [(seq, exc) for seq in lost]

    def _prefill_isolated(
        self, seqs: list[Sequence], stepping: list[Sequence]
    ) -> tuple[torch.Tensor, list[Sequence], Failed]:
        """Batched prefill, the running ``stepping`` rows taking their next token in the same forward
        where that pays (the runner decides); if it fails, retry the prompts one by one, without
        stepping anybody, so only the culprit fails. (The running rows' KV values are untouched: a
        prefill replaces the batch only after its forward; rows not stepped take their token in a
        later step.)"""
        try:
            rows, logits = self.runner.prefill(seqs, stepping)
            self._stats.mixed_steps += len(rows) > len(seqs)
            return logits, rows, []
        except Exception as exc:
            if (len(seqs) == 1 and not stepping) or _is_device_error(exc):  # nothing to isolate, or to run
                return torch.empty(0), [], [(seq, exc) for seq in seqs]
        ok: list[Sequence] = []
        logit_rows: list[torch.Tensor] = []
        failed: Failed = []
        for seq in seqs:
            try:
                logit_rows.append(self.runner.prefill([seq])[1])
                ok.append(seq)
            except Exception as exc:
                failed.append((seq, exc))
        return (torch.cat(logit_rows) if logit_rows else torch.empty(0)), ok, failed

    def _end_step(self, failed: Failed, ran: bool) -> None:
        """Count the step, then fail its failed sequences: a listener told of the failure already sees
        the engine's health after this step."""
        if failed:
            self._count_step(ok=ran, exc=failed[-1][1])
        elif ran:
            self._stats.failed_steps = 0
        for seq, exc in failed:
            self._fail(seq, exc)

    def _fail(self, seq: Sequence, exc: Exception) -> None:
        log.exception("request %s failed", seq.id, exc_info=exc)
        self._stats.errors += 1
        seq.error = f"{type(exc).__name__}: {exc}"
        self.scheduler.finish(seq)
        self._finish(seq, FinishReason.ERROR)

    def _count_step(self, ok: bool, exc: Exception) -> None:
        """A step in which every sequence failed in the runner counts against health; a step that ran
        anybody resets the count. A device error is unhealthy at once."""
        self._stats.failed_steps = 0 if ok else self._stats.failed_steps + 1
        reason = f"{type(exc).__name__}: {exc}"
        if _is_device_error(exc):
            self._turn_unhealthy(f"device error: {reason}")
        elif self._stats.failed_steps >= self.config.max_failed_steps:
            self._turn_unhealthy(f"{self._stats.failed_steps} engine steps failed in a row; last: {reason}")

    def _turn_unhealthy(self, why: str) -> None:
        log.error("engine unhealthy: %s", why)
        self._last_error = why
        self._healthy = False

    def _postprocess(self, seqs: list[Sequence], logits: torch.Tensor) -> None:
        params, gens = [s.request.sampling for s in seqs], [s.generator for s in seqs]
        banned = [self._banned(s) for s in seqs]
        tokens = sample(logits, params, gens, banned, self._allowed(seqs, logits))
        now = time.monotonic()
        done: list[tuple[Sequence, str]] = []
        broken: list[tuple[Sequence, Exception]] = []
        for seq, tok in zip(seqs, tokens, strict=True):
            if isinstance(tok, int) and seq.grammar is not None and not seq.grammar.accept_token(tok):
                tok = ValueError(f"the response format's grammar refused token {tok}")
            if not isinstance(tok, int):
                broken.append((seq, tok))
                continue
            if not seq.output_ids:
                seq.first_token_at = now
                self._stats.prompt_tokens += seq.num_prompt_tokens
                self._stats.cached_tokens += seq.num_cached_tokens
            seq.output_ids.append(tok)
            self._stats.generated_tokens += 1
            reason = self._check_finish(seq, tok)
            text, stopped = seq.detok.step(seq.output_ids, reason is not None, self._past_minimum(seq))
            if stopped:
                reason = FinishReason.STOP
                text += seq.detok.step(seq.output_ids, final=True)[0]
            seq.finish_reason = reason
            if reason is not None:
                done.append((seq, text))
            else:
                self._emit(seq, TokenEvent(seq.id, (tok,), text, len(seq.output_ids) - 1))
        self.runner.release([s for s, _ in done], [s.request.use_cache for s, _ in done])
        for seq, text in done:
            self.scheduler.finish(seq)
            self._finish(seq, seq.finish_reason or FinishReason.STOP, last=seq.output_ids[-1], text=text)
        # a broken row's KV may hold NaN: it leaves the batch and is never cached
        self.runner.release([s for s, _ in broken], [False] * len(broken))
        for seq, exc in broken:
            self._fail(seq, exc)

    def _allowed(self, seqs: list[Sequence], logits: torch.Tensor) -> list[torch.Tensor | None] | None:
        """Structured rows' allowed tokens (None when the whole batch is free text)."""
        if all(s.grammar is None for s in seqs):
            return None
        return self.grammars.get().allowed([s.grammar for s in seqs], logits.device)

    def _banned(self, seq: Sequence) -> tuple[int, ...]:
        """EOS may not be sampled before ``min_tokens`` (vLLM's rule; the tokens about to be added
        count: a row with ``len(output_ids) == min_tokens`` may end)."""
        short = len(seq.output_ids) < seq.request.sampling.min_tokens
        return self._eos_order if short and not seq.request.sampling.ignore_eos else ()

    @staticmethod
    def _past_minimum(seq: Sequence) -> bool:
        """Stop strings count only once the text is longer than ``min_tokens`` tokens (as in vLLM)."""
        return len(seq.output_ids) > seq.request.sampling.min_tokens

    def _check_finish(self, seq: Sequence, tok: int) -> FinishReason | None:
        if seq.grammar is not None and seq.grammar.is_terminated():  # the JSON is complete (EOS taken)
            return FinishReason.STOP
        if tok in seq.eos_ids and not seq.request.sampling.ignore_eos:
            return FinishReason.STOP
        if len(seq.output_ids) >= seq.request.sampling.max_tokens:
            return FinishReason.LENGTH
        return None

    def _finish(self, seq: Sequence, reason: FinishReason, last: int | None = None, text: str = "") -> None:
        now = time.monotonic()
        seq.finish_reason = reason
        start = seq.admitted_at or now
        timings = Timings(
            queue=start - seq.arrival,
            vision=seq.vision_s,
            prefill=seq.prefill_s,
            generation=now - (seq.first_token_at or now),
            ttft=(seq.first_token_at - seq.arrival) if seq.first_token_at else 0.0,
        )
        usage = Usage(seq.num_prompt_tokens, len(seq.output_ids), seq.num_cached_tokens)
        tokens = (last,) if last is not None else ()
        index = len(seq.output_ids) - len(tokens)
        with self._cv:
            self._stats.finished[reason.value] = self._stats.finished.get(reason.value, 0) + 1
            self._known.pop(seq.id, None)
        self._emit(seq, TokenEvent(seq.id, tokens, text, index, reason, seq.error, usage, timings))

    @staticmethod
    def _emit(seq: Sequence, event: TokenEvent) -> None:
        Engine._emit_to(seq.on_event, seq.id, event)

    @staticmethod
    def _emit_to(on_event: EventCallback, request_id: str, event: TokenEvent) -> None:
        try:
            on_event(event)
        except Exception:  # a broken listener must not take the engine down
            log.exception("on_event callback failed for %s", request_id)


def _is_device_error(exc: Exception) -> bool:
    """The device (CUDA context) is broken: every later step would fail too. Out of memory is not: it
    fails the sequences of that step only."""
    if isinstance(exc, torch.OutOfMemoryError):
        return False
    return isinstance(exc, torch.AcceleratorError) or any(m in str(exc) for m in DEVICE_ERROR_MARKERS)
