"""The three caches: bounds and LRU eviction, TTL, integrity checks, and that a cache never hands one
session or image the KV/features of another."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import torch

from bench.common import draw_image, image_input
from services.engine import GenerationRequest, SamplingParams
from services.engine.caches import CacheIntegrityError, ImageCache, KVEntry, PrefixCache, SessionCache
from services.engine.sequence import ImageSpan, Prompt
from tests.services.engine.reference import check, run_all, user


def _feat(value: float) -> torch.Tensor:
    return torch.full((4, 8), float(value))  # 128 bytes


def test_bounded_lru_eviction_and_integrity():
    cache = ImageCache(capacity_bytes=300)
    for i in range(2):
        assert cache.put(f"{i:064x}", _feat(i))
    assert cache.get(f"{0:064x}") is not None  # 0 is now the most recent
    cache.put(f"{2:064x}", _feat(2))  # over budget: evicts 1, the least recently used
    assert cache.keys() == [f"{0:064x}", f"{2:064x}"]
    assert cache.stats().evictions == 1 and cache.bytes == 256
    assert not cache.put(f"{3:064x}", torch.zeros(100, 8))  # larger than the whole budget
    cache.check_integrity()
    stored = cache.peek(f"{0:064x}")
    assert stored is not None
    stored.add_(1)  # somebody wrote into a stored tensor
    with pytest.raises(CacheIntegrityError, match="changed"):
        cache.check_integrity()


def test_session_ttl_and_isolation():
    cache = SessionCache(capacity_bytes=1 << 20, ttl_s=0.05)
    kv = [(torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 3, 4))]
    cache.put("a", KVEntry((1, 2, 3), (), kv))
    prompt = Prompt([1, 2, 3, 4], torch.arange(4), [])
    assert cache.match("b", prompt) == (None, 0)  # another session never sees a's KV
    assert cache.match("a", prompt)[1] == 3
    time.sleep(0.06)
    assert cache.match("a", prompt) == (None, 0) and cache.stats().entries == 0


def test_match_stops_at_a_different_image():
    kv = [(torch.zeros(1, 1, 6, 2), torch.zeros(1, 1, 6, 2))]
    entry = KVEntry((5, 9, 9, 9, 6, 7), (ImageSpan(1, 4, 0, "a" * 64),), kv)
    same = Prompt([5, 9, 9, 9, 6, 7, 8], torch.arange(7), [ImageSpan(1, 4, 0, "a" * 64)])
    other = Prompt([5, 9, 9, 9, 6, 7, 8], torch.arange(7), [ImageSpan(1, 4, 0, "b" * 64)])
    assert entry.match_length(same) == 6
    assert entry.match_length(other) == 1  # equal placeholder ids, different image: reuse stops before it
    prefix = PrefixCache(1 << 20)
    prefix.add(entry)
    assert prefix.match(Prompt([5, 9], torch.arange(2), []))[1] == 1  # always leaves one token to prefill


def test_session_entry_shares_the_prefix_entry_kv_without_counting_it():
    full = torch.arange(2 * 5 * 3, dtype=torch.float32).reshape(1, 2, 5, 3)
    prefix = PrefixCache(1 << 20)
    prefix.add(KVEntry((1, 2, 3), (), [(full[:, :, :3].clone(), -full[:, :, :3].clone())]))
    root, m = prefix.match(Prompt([1, 2, 3, 4, 5, 6], torch.arange(6), []))
    assert root is not None and m == 3
    shared = root.head(m)
    assert shared[0][0].data_ptr() == root.kv[0][0].data_ptr()  # views: nothing copied
    entry = KVEntry((1, 2, 3, 4, 5), (), [(full[:, :, 3:].clone(), -full[:, :, 3:].clone())], shared)
    sessions = SessionCache(1 << 20, ttl_s=60)
    sessions.put("s", entry)
    assert sessions.bytes == 2 * (2 * 2 * 3 * 4)  # the two own tokens only: the prefix cache owns the rest
    sessions.check_integrity()
    assert torch.equal(entry.head(5)[0][0], full) and torch.equal(entry.head(5)[0][1], -full)
    assert torch.equal(entry.head(2)[0][0], full[:, :, :2])  # within the shared part: a view
    assert torch.equal(entry.head(4)[0][1], -full[:, :, :4])  # across both parts
    with pytest.raises(ValueError, match="owns all"):
        prefix.add(entry)
    bad = KVEntry((1, 2, 3, 4), (), entry.kv, shared)  # 3 shared + 2 own for 4 tokens
    sessions.put("bad", bad)
    with pytest.raises(CacheIntegrityError, match="KV shape"):
        sessions.check_integrity()


def _kv_entry(tokens: tuple[int, ...]) -> KVEntry:
    kv = [(torch.zeros(1, 1, len(tokens), 2), torch.zeros(1, 1, len(tokens), 2))]
    return KVEntry(tokens, (), kv)


def test_prefix_match_over_two_entries_picks_the_longest_and_refreshes_only_it():
    """Regression: ``match`` moved each better entry to the end while iterating (RuntimeError)."""
    prefix = PrefixCache(1 << 20)
    prefix.add(_kv_entry((1, 2, 3)))  # oldest; matches 3 tokens
    prefix.add(_kv_entry((1, 2, 9)))  # matches 2
    prefix.add(_kv_entry((7, 7)))  # matches nothing
    entry, m = prefix.match(Prompt([1, 2, 3, 4], torch.arange(4), []))
    assert entry is not None and entry.tokens == (1, 2, 3) and m == 3
    assert prefix.keys() == [(1, 2, 9), (7, 7), (1, 2, 3)]  # the match is now the most recent
    assert prefix.match(Prompt([5, 6], torch.arange(2), [])) == (None, 0)
    s = prefix.stats()
    assert (s.hits, s.misses) == (1, 1)
    prefix.check_integrity()


def _hammer(work: Callable[[int], None], seconds: float = 1.0) -> list[BaseException]:
    """Run ``work(i)`` for i = 0, 1, ... on two threads at once; the exceptions they raised."""
    errors: list[BaseException] = []
    stop = time.monotonic() + seconds

    def loop(thread: int) -> None:
        i = thread
        try:
            while time.monotonic() < stop:
                work(i)
                i += 2
        except BaseException as exc:  # reported to the test thread
            errors.append(exc)

    threads = [threading.Thread(target=loop, args=(t,)) for t in range(2)]
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible: races show within a second
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(old)
    return errors


def test_concurrent_prefix_match_and_put_keep_the_cache_whole():
    """Regression: ``match`` read and reordered the slots and counters without the cache's lock."""
    prefix = PrefixCache(capacity_bytes=8 * 64)  # 8 entries of 4 tokens (64 bytes of KV): puts evict
    prompt = Prompt([0, 1, 2, 3, 4], torch.arange(5), [])
    matches = [0]

    def work(i: int) -> None:
        if i % 2:  # one thread adds entries, the other matches
            prefix.add(_kv_entry((0, 1, i % 3, i)))
        else:
            prefix.match(prompt)
            matches[0] += 1

    assert _hammer(work) == []
    prefix.check_integrity()
    s = prefix.stats()
    assert s.hits + s.misses == matches[0] and s.entries <= 8 and s.evictions > 0


def test_concurrent_session_match_and_put_keep_the_cache_whole():
    session = SessionCache(capacity_bytes=3 * 64, ttl_s=60)  # 3 of the 4 sessions fit
    prompt = Prompt([0, 1, 2, 3, 4], torch.arange(5), [])
    matches = [0]

    def work(i: int) -> None:
        sid = f"s{(i // 2) % 4}"
        if i % 2:
            session.put(sid, _kv_entry((0, 1, 2, 3)))
        else:
            session.match(sid, prompt)
            matches[0] += 1

    assert _hammer(work) == []
    session.check_integrity()
    s = session.stats()
    assert s.hits + s.misses == matches[0] and s.entries <= 3


def _session_turns(
    engine: Any, proc: Any, sid: str, png: bytes, tag: str
) -> list[tuple[GenerationRequest, Any]]:
    return [
        (
            GenerationRequest(
                f"{sid}-{tag}",
                [user("What colour is the big shape?")],
                [image_input(proc, png)],
                SamplingParams(max_tokens=8),
                session_id=sid,
            ),
            png,
        )
    ]


def test_concurrent_sessions_never_see_each_others_kv(bundled, make_engine, bundled_tie_tol):
    """Four sessions with the same words but different images run their turns together."""
    model, proc = bundled
    engine = make_engine(model, proc)
    pngs = [draw_image(20 + i) for i in range(4)]
    history: dict[str, list[dict[str, Any]]] = {
        f"s{i}": [user("What colour is the big shape?")] for i in range(4)
    }
    for turn, follow_up in enumerate([None, "Where is it?", "And its shape?"]):
        reqs = []
        for i, (sid, msgs) in enumerate(history.items()):
            if follow_up:
                msgs.append(user(follow_up, image=False))
            reqs.append(
                GenerationRequest(
                    f"{sid}-{turn}",
                    list(msgs),
                    [image_input(proc, pngs[i])],
                    SamplingParams(max_tokens=8),
                    session_id=sid,
                )
            )
        out = run_all(engine, reqs)
        for i, req in enumerate(reqs):
            check(out[req.request_id], model, proc, req, [pngs[i]], bundled_tie_tol)
            answer = "".join(e.text for e in out[req.request_id])
            history[str(req.session_id)].append(
                {"role": "assistant", "content": [{"type": "text", "text": answer}]}
            )
            if turn:
                usage = out[req.request_id][-1].usage
                assert usage is not None and usage.cached_tokens > 100
    entries = {sid: engine.caches.session.peek(sid) for sid in history}
    assert [e.spans[0].digest for e in entries.values()] == [image_input(proc, p).digest for p in pngs]
    engine.caches.session.check_integrity()


def test_changed_image_in_a_session_is_not_served_from_stale_kv(bundled, make_engine, bundled_tie_tol):
    model, proc = bundled
    engine = make_engine(model, proc)
    msgs = [user("What colour is the big shape?")]
    a, b = draw_image(31), draw_image(32)
    engine.generate_sync(GenerationRequest("t1", msgs, [image_input(proc, a)], session_id="s"))
    req = GenerationRequest("t2", msgs, [image_input(proc, b)], SamplingParams(max_tokens=8), session_id="s")
    ev = engine.generate_sync(req)
    check(ev, model, proc, req, [b], bundled_tie_tol)
    text = proc.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    before_image = proc.tokenizer(text.split("<|begin_of_image|>")[0], add_special_tokens=False)["input_ids"]
    assert ev[-1].usage.cached_tokens <= len(before_image) + 1  # stopped before the image


def test_evicted_session_is_rebuilt_from_the_conversation(bundled, make_engine, bundled_tie_tol):
    model, proc = bundled
    engine = make_engine(model, proc, session_cache_bytes=1)  # nothing fits: every turn rebuilds
    png = draw_image(40)
    msgs = [user("What shape is it?")]
    first = engine.generate_sync(GenerationRequest("t1", msgs, [image_input(proc, png)], session_id="s"))
    msgs += [
        {"role": "assistant", "content": [{"type": "text", "text": "".join(e.text for e in first)}]},
        user("And its colour?", image=False),
    ]
    req = GenerationRequest(
        "t2", msgs, [image_input(proc, png)], SamplingParams(max_tokens=8), session_id="s"
    )
    ev = engine.generate_sync(req)
    check(ev, model, proc, req, [png], bundled_tie_tol)
    s = engine.stats().caches["session"]
    assert s.entries == 0 and s.hits == 0 and s.misses == 2


def test_engine_caches_stay_within_bounds(bundled, make_engine):
    model, proc = bundled
    image = image_input(proc, draw_image(50))
    feature_bytes = int(image.image_grid_thw.prod()) // 4 * model.config.text_config.hidden_size * 4
    probe = make_engine(model, proc, prewarm=False)
    session_bytes = probe.arch.kv_bytes_per_token() * 20  # a turn's own tokens (the system prompt is shared)
    engine = make_engine(
        model, proc, image_cache_bytes=3 * feature_bytes, session_cache_bytes=3 * session_bytes
    )
    reqs = [
        GenerationRequest(
            f"r{i}",
            [user("Where is it?")],
            [image_input(proc, draw_image(50 + i))],
            SamplingParams(max_tokens=4),
            session_id=f"s{i}",
        )
        for i in range(10)
    ]
    run_all(engine, reqs)
    stats = engine.stats().caches
    for name in ("image", "session"):
        assert stats[name].evictions > 0 and stats[name].bytes <= stats[name].capacity_bytes
    for cache in engine.caches.all():
        cache.check_integrity()
