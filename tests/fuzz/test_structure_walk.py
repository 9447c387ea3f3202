"""The structure walk (``shared.formats.check_structure``) in-process on thousands of mutated and
random files: the only exception it lets out is ``StructureError``, with a reason, and no file
costs it more than a few milliseconds per megabyte."""

from __future__ import annotations

import random
import time

from shared.formats import StructureError, check_structure, sniff_format
from tests.fuzz.corpus import corpus, flipped, valid_images

MAGIC = [b"\xff\xd8\xff", b"\x89PNG\r\n\x1a\n\x00\x00\x00\x0dIHDR", b"RIFF\xff\xff\x00\x00WEBPVP8X"]
FILLERS = [
    b"\xff",
    b"\xff\x00",
    b"\xff\x01",
    b"\xff\xd0",
    b"\x00",
    b"\xff\xe0\x00\x02",
    b"\x00\x00\x00\x00IDAT",
]


def walk(data: bytes) -> float:
    """Seconds the walk took; asserts it either passed or raised StructureError with a reason."""
    fmt = sniff_format(data)
    if fmt is None:
        return 0.0
    started = time.perf_counter()
    try:
        check_structure(data, fmt)
    except StructureError as exc:
        assert str(exc) and exc.problem in ("corrupt", "truncated", "too_complex")
    return time.perf_counter() - started


def test_mutated_files_only_raise_structure_errors() -> None:
    rng = random.Random(15)
    bases = list(valid_images().values())
    slowest = max(walk(flipped(rng.choice(bases), rng)) for _ in range(4000))
    assert slowest < 0.05, f"slowest walk {slowest * 1000:.1f} ms"


def test_random_and_repeated_bytes_after_each_magic_stay_linear() -> None:
    rng = random.Random(16)
    for magic in MAGIC:
        for filler in FILLERS:
            data = magic + filler * (1_000_000 // len(filler))
            assert walk(data) < 0.1, (magic, filler)
        for _ in range(20):
            assert walk(magic + rng.randbytes(rng.randrange(1, 200_000))) < 0.1


def test_the_gateway_corpus_walks_fast() -> None:
    slowest = max((walk(case.data), case.name) for case in corpus())
    assert slowest[0] < 0.1, slowest
