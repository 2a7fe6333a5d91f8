import base64
import io
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

from rlloom.multimodal import fit_pixel_budget, load_image, vision_grid


def _png_bytes(size: tuple[int, int] = (40, 30), mode: str = "RGBA") -> bytes:
    buffer = io.BytesIO()
    Image.new(mode, size, color=(10, 20, 30, 255) if mode == "RGBA" else 128).save(buffer, format="PNG")
    return buffer.getvalue()


def test_every_source_kind_gives_the_same_rgb_pixels(tmp_path: Path) -> None:
    data = _png_bytes()
    path = tmp_path / "img.png"
    path.write_bytes(data)
    uri = "data:image/png;base64," + base64.b64encode(data).decode()
    images = [
        load_image(data),
        load_image(path),
        load_image(str(path)),
        load_image(uri),
        load_image(Image.open(io.BytesIO(data))),
    ]
    for image in images:
        assert image.mode == "RGB" and image.size == (40, 30)
        assert np.array_equal(np.asarray(image), np.asarray(images[0]))
    assert tuple(np.asarray(images[0])[0, 0]) == (10, 20, 30)


def test_bad_sources_name_the_problem(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="missing.png"):
        load_image(tmp_path / "missing.png")
    with pytest.raises(ValueError, match="cannot decode image from raw bytes: not an image format PIL reads") as bad:
        load_image(b"not an image")
    assert "BytesIO" not in str(bad.value)  # no object address in the message
    with pytest.raises(ValueError, match="base64"):
        load_image("data:image/png;base64,@@@")
    with pytest.raises(ValueError, match="must be base64"):
        load_image("data:image/png,abc")


def test_pixel_budget_scales_down_and_up_keeping_aspect() -> None:
    big = Image.new("RGB", (4000, 2000))
    fitted = fit_pixel_budget(big, min_pixels=100, max_pixels=1_000_000)
    assert fitted.size == (1414, 707)  # sqrt(1e6 / 8e6) = 0.35355 -> int(4000 * s), int(2000 * s)
    small = Image.new("RGB", (10, 10))
    assert fit_pixel_budget(small, min_pixels=400, max_pixels=10_000).size == (20, 20)
    same = Image.new("RGB", (50, 50))
    assert fit_pixel_budget(same, min_pixels=100, max_pixels=10_000) is same
    with pytest.raises(ValueError, match="min_pixels"):
        fit_pixel_budget(same, min_pixels=10, max_pixels=5)


@settings(max_examples=40, deadline=None)
@given(st.integers(28, 600), st.integers(28, 600))
def test_vision_grid_matches_the_qwen2_vl_image_processor(height: int, width: int) -> None:
    processor = Qwen2VLImageProcessorPil(min_pixels=56 * 56, max_pixels=28 * 28 * 256)
    image = Image.fromarray(np.zeros((height, width, 3), dtype=np.uint8))
    out = processor(images=[image], return_tensors="np")
    expected = tuple(int(x) for x in out["image_grid_thw"][0])
    grid = vision_grid(height, width, min_pixels=56 * 56, max_pixels=28 * 28 * 256)
    assert grid.grid_thw == expected
    assert grid.num_tokens == math.prod(expected) // 4
    assert out["pixel_values"].shape[0] == math.prod(expected)
