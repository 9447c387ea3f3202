"""Safe decoding in-process: allowlist, bombs, truncation, draft mode, EXIF, processor id."""

from __future__ import annotations

import io
import time

import pytest
from PIL import Image

from services.vlm.image_processor import ImageProcessorHandle
from tests.support.models import random_model_path
from tests.worker.images import bad_images, good_images
from worker.imaging import ImageRejected, configure_pillow, decode_image, draft_size

MAX_PIXELS = 40_000_000
TARGET = 32768  # the bundled processor's max pixels


@pytest.fixture(scope="module", autouse=True)
def _pillow_limits() -> None:
    configure_pillow(MAX_PIXELS)


@pytest.mark.parametrize("name", sorted(good_images()))
def test_good_images_decode_to_rgb(name: str) -> None:
    img = decode_image(good_images()[name], MAX_PIXELS, TARGET)
    assert img.mode == "RGB" and img.width > 0 and img.height > 0


@pytest.mark.parametrize("name", sorted(bad_images()))
def test_bad_images_are_rejected_with_a_reason(name: str) -> None:
    data, reason = bad_images()[name]
    with pytest.raises(ImageRejected, match=reason):
        decode_image(data, MAX_PIXELS, TARGET)


def test_mpo_decodes_its_first_frame() -> None:
    """Pillow calls these "MPO" (Ultra HDR, many phone photos): the first frame is the picture."""
    data = good_images()["mpo_two_frames"]
    assert Image.open(io.BytesIO(data)).format == "MPO"
    img = decode_image(data, MAX_PIXELS, TARGET)
    assert img.size == (160, 120)
    red, green, _ = img.getpixel((80, 60))  # type: ignore[misc]
    assert red > 200 and green < 50


@pytest.mark.parametrize(
    "name", ["jpeg_com_flood", "png_chunk_flood", "jpeg_dqt_flood", "jpeg_photoshop_flood", "png_ztxt_bomb"]
)
def test_marker_and_chunk_floods_are_refused_fast(name: str) -> None:
    """Headers Pillow parses in Python: 10 MB of empty markers/chunks took it 4-5 s, DQT and APP13
    floods 1.6-2.3 s, zTXt bombs 0.5 s and 64 MB; the structure walk stops each at a small cap."""
    data, reason = bad_images()[name]
    started = time.perf_counter()
    with pytest.raises(ImageRejected, match=reason):
        decode_image(data, MAX_PIXELS, TARGET)
    assert time.perf_counter() - started < 0.5


def test_exif_orientation_is_applied() -> None:
    img = decode_image(good_images()["jpeg_exif_rotated"], MAX_PIXELS, TARGET)
    assert img.size == (160, 320)  # orientation 6: rotated 90°


def test_draft_mode_decodes_big_jpeg_at_reduced_scale() -> None:
    data = good_images()["jpeg_4000x3000"]
    full = decode_image(data, MAX_PIXELS, TARGET, draft=False)
    small = decode_image(data, MAX_PIXELS, TARGET, draft=True)
    assert full.size == (4000, 3000)
    assert small.size == (500, 375)  # 1/8 scale, still >= the processor's target per axis
    want = draft_size((4000, 3000), TARGET)
    assert small.width >= want[0] and small.height >= want[1]


def test_draft_oversample_sets_how_far_draft_mode_reduces() -> None:
    data = good_images()["jpeg_1080p"]
    sizes = {}
    for oversample in (1.0, 2.0):
        img = decode_image(data, MAX_PIXELS, TARGET, oversample=oversample)
        want = draft_size((1920, 1080), TARGET, oversample)
        assert img.width >= want[0] and img.height >= want[1]
        sizes[oversample] = img.size
    assert sizes[1.0][0] < sizes[2.0][0] < 1920  # a smaller DCT scale for a smaller oversample


def test_draft_mode_is_faster_on_a_1080p_jpeg() -> None:
    data = good_images()["jpeg_1080p"]
    handle = ImageProcessorHandle.load(str(random_model_path()))

    def best_ms(draft: bool) -> float:
        times = []
        for _ in range(5):
            start = time.perf_counter()
            handle(decode_image(data, MAX_PIXELS, handle.target_pixels, draft=draft))
            times.append((time.perf_counter() - start) * 1000)
        return min(times)

    with_draft, without = best_ms(True), best_ms(False)
    print(f"1080p JPEG decode+process: {without:.1f} ms full, {with_draft:.1f} ms draft")
    assert with_draft < without


@pytest.mark.filterwarnings("ignore::PIL.Image.DecompressionBombWarning")
def test_pillow_itself_refuses_bombs_after_configure() -> None:
    buf = io.BytesIO()
    Image.new("L", (8000, 6000)).save(buf, format="PNG")  # 48 MP > 40 MP
    with pytest.raises(ImageRejected, match="too large"):
        decode_image(buf.getvalue(), MAX_PIXELS, TARGET)


def test_processor_id_is_stable_and_config_sensitive() -> None:
    a = ImageProcessorHandle.load(str(random_model_path()))
    b = ImageProcessorHandle.load(str(random_model_path()))
    assert a.processor_id == b.processor_id and len(a.processor_id) == 16
    a.processor.patch_size = 16
    from services.vlm.image_processor import processor_id

    assert processor_id(a.processor) != b.processor_id
