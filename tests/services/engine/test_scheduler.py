"""Scheduler and batch-KV bookkeeping on hand-made sequences (no model), like vLLM's scheduler tests."""

from __future__ import annotations

import time

import torch
from transformers import DynamicCache

from services.engine import FinishReason, GenerationRequest
from services.engine.detok import Detokenizer
from services.engine.kv import BatchKV, stack_left
from services.engine.scheduler import Scheduler
from services.engine.sequence import Prompt, Sequence, Status


def _seq(rid: str, deadline: float | None = None, priority: int = 0) -> Sequence:
    req = GenerationRequest(rid, [{"role": "user", "content": "hi"}], deadline=deadline, priority=priority)
    return Sequence(
        req, Prompt([1, 2, 3], torch.arange(3), []), lambda ev: None, Detokenizer(None, ()), frozenset()
    )


def test_idle_engine_admits_at_once_then_the_window_groups():
    s = Scheduler(max_batch=4, window_s=0.05)
    s.add(_seq("a"))
    assert [q.id for q in s.schedule().prefill] == ["a"]  # idle: no wait
    s.add(_seq("b"))
    batch = s.schedule()
    assert not batch.prefill and [q.id for q in batch.decode] == ["a"]  # busy: b waits for the window
    s.add(_seq("c"))
    s.add(_seq("d"))
    assert [q.id for q in s.schedule().prefill] == ["b", "c", "d"]  # they fill every free slot


def test_window_expiry_admits_a_partial_group():
    s = Scheduler(max_batch=4, window_s=0.01)
    s.add(_seq("a"))
    s.schedule()
    s.add(_seq("b"))
    assert not s.schedule().prefill
    time.sleep(0.015)
    assert [q.id for q in s.schedule().prefill] == ["b"]


def test_while_sequences_run_a_prefill_waits_for_enough_free_slots():
    """Each prefill stops every running sequence's decode: a slot freed alone is not refilled at once
    while others run; two freed slots are, in one prefill (``min_free``), and the window bounds the wait."""
    s = Scheduler(max_batch=4, window_s=60.0, min_free=2)
    for rid in "abcd":
        s.add(_seq(rid))
    assert len(s.schedule().prefill) == 4  # idle engine: everything at once
    for rid in "efgh":
        s.add(_seq(rid))
    s.finish(s.running[0])
    batch = s.schedule()
    assert not batch.prefill and [q.id for q in batch.decode] == ["b", "c", "d"]  # one free slot: decode
    s.finish(s.running[0])
    assert [q.id for q in s.schedule().prefill] == ["e", "f"]  # two free, waiters fill them: one prefill
    s.finish(s.running[0])
    assert not s.schedule().prefill
    s.waiting[0].arrival -= 61.0  # g has waited the whole window: it goes in alone
    assert [q.id for q in s.schedule().prefill] == ["g"]


def test_cap_fifo_cancel_and_deadlines():
    s = Scheduler(max_batch=2, window_s=0.0)
    seqs = [_seq("a"), _seq("b"), _seq("c"), _seq("late", deadline=time.time() - 1), _seq("e")]
    for q in seqs:
        s.add(q)
    batch = s.schedule()
    assert [q.id for q in batch.prefill] == ["a", "b"]  # cap 2, oldest first
    assert [(q.id, r) for q, r in batch.dropped] == [("late", FinishReason.EXPIRED)]  # never runs
    s.cancel("a")
    batch = s.schedule()
    assert [(q.id, r) for q, r in batch.dropped] == [("a", FinishReason.CANCELLED)]
    assert [q.id for q in batch.prefill] == ["c"]  # the freed slot goes to the next in line
    assert seqs[0].status is Status.FINISHED and len(s.running) == 2


def _cache(layers: list[tuple[torch.Tensor, torch.Tensor]], filled: int | None) -> DynamicCache:
    """A plain DynamicCache of ``layers`` (their first ``filled`` columns where given)."""
    cut = slice(None) if filled is None else slice(filled)
    return DynamicCache(ddp_cache_data=[(k[..., cut, :], v[..., cut, :]) for k, v in layers])


def _kv(rows: list[list[float]], prefix: str) -> BatchKV:
    """A 1-layer batch whose keys hold each row's token values (heads=1, dim=1), right-aligned."""
    length = max(len(r) for r in rows)
    keys = stack_left([torch.tensor(r).view(1, 1, -1, 1) for r in rows], length)
    b = BatchKV(_cache)
    b.ids = [f"{prefix}{i}" for i in range(len(rows))]
    b.cache = DynamicCache(ddp_cache_data=[(keys, keys.clone())])
    b.mask = torch.stack([torch.arange(length) >= length - len(r) for r in rows])
    return b


def test_batch_kv_merge_remove_extract_keep_each_rows_tokens():
    a = _kv([[1, 2, 3], [4, 5]], "a")
    a.merge(_kv([[6, 7, 8, 9]], "b"))
    assert a.length == 4 and a.ids == ["a0", "a1", "b0"]
    # Every row right-aligned, zeros in front (masked columns must hold finite values).
    assert a.layers()[0][0].flatten().tolist() == [0, 1, 2, 3, 0, 0, 4, 5, 6, 7, 8, 9]
    a.ids = ["x", "y", "z"]
    assert a.extract("x", 3)[0][0].flatten().tolist() == [1, 2, 3]
    assert a.extract("z", 4)[0][0].flatten().tolist() == [6, 7, 8, 9]
    a.remove({"z"})  # the longest row leaves: the leading all-padding column is trimmed
    assert a.length == 3 and a.ids == ["x", "y"]
    assert a.extract("y", 2)[0][0].flatten().tolist() == [4, 5]
    assert a.decode_mask() is not None  # y still has padding
    a.remove({"y"})
    assert a.decode_mask() is None and a.extract("x", 3)[0][0].flatten().tolist() == [1, 2, 3]


def test_interactive_is_admitted_before_batch_and_batch_ages_in() -> None:
    scheduler = Scheduler(max_batch=1, window_s=0.0, aging_s=60.0)
    batch, interactive = _seq("b", priority=1), _seq("i", priority=0)
    scheduler.add(batch)
    scheduler.add(interactive)
    assert [s.id for s in scheduler.schedule().prefill] == ["i"]  # the later one, first
    scheduler.finish(interactive)
    assert [s.id for s in scheduler.schedule().prefill] == ["b"]
    old, new = _seq("old-batch", priority=1), _seq("new", priority=0)
    old.arrival -= 61  # it has waited past aging_s
    scheduler.finish(batch)
    scheduler.add(new)
    scheduler.add(old)
    assert [s.id for s in scheduler.schedule().prefill] == ["old-batch"]  # aged in: oldest first


def test_batch_work_leaves_a_quarter_of_the_slots_to_interactive_arrivals() -> None:
    scheduler = Scheduler(max_batch=8, window_s=0.0, aging_s=60.0)
    for i in range(10):
        scheduler.add(_seq(f"b{i}", priority=1))
    assert [s.id for s in scheduler.schedule().prefill] == [f"b{i}" for i in range(6)]  # 2 kept free
    assert not scheduler.schedule().prefill  # batch work waits although two slots are free
    scheduler.add(_seq("i", priority=0))
    assert [s.id for s in scheduler.schedule().prefill] == ["i"]  # no wait for a batch one to end
    aged = scheduler.waiting[0]
    aged.arrival -= 61  # waited past aging_s: it counts as interactive and takes the last slot
    assert [s.id for s in scheduler.schedule().prefill] == [aged.id]


def test_batch_work_is_not_admitted_while_interactive_work_runs_or_waits() -> None:
    scheduler = Scheduler(max_batch=8, window_s=0.0, aging_s=60.0)
    interactive = _seq("i", priority=0)
    scheduler.add(interactive)
    scheduler.add(_seq("b0", priority=1))
    assert [s.id for s in scheduler.schedule().prefill] == ["i"]  # b0 waits: i is there
    batch = scheduler.schedule()
    assert not batch.prefill and [s.id for s in batch.decode] == ["i"]  # i's tokens, no b0 prefill
    scheduler.add(aged := _seq("b-aged", priority=1))
    aged.arrival -= 61  # waited past aging_s: it goes in although i still runs
    assert [s.id for s in scheduler.schedule().prefill] == ["b-aged"]
    scheduler.finish(interactive)
    assert [s.id for s in scheduler.schedule().prefill] == ["b0"]  # i ended: batch work joins


def test_an_interactive_arrival_does_not_wait_for_the_window_behind_batch_work() -> None:
    scheduler = Scheduler(max_batch=8, window_s=60.0, aging_s=600.0)  # a window that never ends here
    scheduler.add(_seq("b0", priority=1))
    assert [s.id for s in scheduler.schedule().prefill] == ["b0"]  # idle engine: at once
    scheduler.add(_seq("b1", priority=1))
    assert not scheduler.schedule().prefill  # batch work running: a batch arrival waits the window
    scheduler.add(_seq("i0", priority=0))
    assert [s.id for s in scheduler.schedule().prefill] == ["i0"]  # only batch runs: no window
    scheduler.add(_seq("i1", priority=0))
    assert not scheduler.schedule().prefill  # interactive work running: the window gathers again


def test_batch_kv_take_moves_rows_out_and_merge_brings_them_back():
    a = _kv([[1, 2, 3], [4, 5], [6, 7, 8, 9]], "a")
    taken = a.take({"a2", "a0"})
    assert taken.ids == ["a0", "a2"] and a.ids == ["a1"] and a.length == 2  # padding trimmed
    assert taken.extract("a0", 3)[0][0].flatten().tolist() == [1, 2, 3]
    assert taken.extract("a2", 4)[0][0].flatten().tolist() == [6, 7, 8, 9]
    assert not a.take({"nobody"}).ids
    a.merge(taken)
    assert a.ids == ["a1", "a0", "a2"] and a.extract("a0", 3)[0][0].flatten().tolist() == [1, 2, 3]


def test_batch_rows_pause_while_interactive_work_runs_unless_aged() -> None:
    scheduler = Scheduler(max_batch=8, window_s=0.0, aging_s=60.0)
    for rid in ("b0", "b1"):
        scheduler.add(_seq(rid, priority=1))
    scheduler.schedule()
    assert [s.id for s in scheduler.schedule().decode] == ["b0", "b1"]  # batch work alone: it runs
    scheduler.add(interactive := _seq("i", priority=0))
    assert [s.id for s in scheduler.schedule().prefill] == ["i"]
    assert [s.id for s in scheduler.schedule().decode] == ["i"]  # b0 and b1 are paused
    scheduler.running[0].arrival -= 61  # b0 waited past aging_s: it steps again
    assert [s.id for s in scheduler.schedule().decode] == ["b0", "i"]
    scheduler.finish(interactive)
    assert [s.id for s in scheduler.schedule().decode] == ["b0", "b1"]  # i ended: all resume


def test_stack_left_right_aligns_rows_of_any_lengths() -> None:
    """Rows all as long as the batch (one op) or shorter (zero-padded on the left): the same layout."""
    g = torch.Generator().manual_seed(0)
    for lengths in ([5, 5, 5], [5, 3, 0, 5]):
        parts = [torch.randn(1, 2, n, 4, generator=g) for n in lengths]
        out = stack_left(parts, 5, spare=3)[..., :5, :]  # spare columns after the filled ones
        assert out.shape == (len(lengths), 2, 5, 4)
        for row, (part, n) in enumerate(zip(parts, lengths, strict=True)):
            assert torch.equal(out[row, :, 5 - n :], part[0])
            assert not out[row, :, : 5 - n].any()


def test_stack_left_takes_parts_of_several_rows() -> None:
    g = torch.Generator().manual_seed(1)
    a, b = torch.randn(2, 2, 5, 4, generator=g), torch.randn(3, 2, 2, 4, generator=g)
    out = stack_left([a, b], 5, spare=4)
    assert out.shape == (5, 2, 9, 4)
    assert torch.equal(out[:2, :, :5], a) and torch.equal(out[2:, :, 3:5], b)
    assert not out[2:, :, :3].any()
