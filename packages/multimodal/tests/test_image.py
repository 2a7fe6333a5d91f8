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
        load_image({"bytes": data, "path": None}),  # an HF datasets image column (hiyouga/geometry3k's parquet)
        load_image({"bytes": None, "path": str(path)}),
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
    # a JSON row's number or null, or a dict without the image: a ValueError naming what is accepted, not a
    # TypeError from pathlib
    for bad_source in (7, None):
        with pytest.raises(ValueError, match=f"from a {type(bad_source).__name__} .*give a file path, bytes"):
            load_image(bad_source)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"keys \['url'\] has neither 'bytes' nor a 'path'"):
        load_image({"url": "x.png"})


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


def test_transparent_pixels_are_composited_on_white_like_transformers() -> None:
    from transformers.image_transforms import convert_to_rgb

    # a diagram on a transparent background: black lines, fully transparent (0, 0, 0, 0) elsewhere
    diagram = Image.new("RGBA", (4, 2), (0, 0, 0, 0))
    diagram.putpixel((0, 0), (0, 0, 0, 255))
    diagram.putpixel((1, 0), (0, 0, 0, 128))
    got = np.asarray(load_image(diagram))
    assert got[0, 0].tolist() == [0, 0, 0]  # the line stays black
    assert got[0, 1].tolist() == [127, 127, 127]  # 255 * (1 - 128 / 255), half covered
    assert got[1, 0].tolist() == [255, 255, 255]  # the background turns white, not black
    assert np.array_equal(got, np.asarray(convert_to_rgb(diagram)))
    grey_alpha = Image.new("LA", (2, 2), (0, 0))
    assert np.asarray(load_image(grey_alpha))[0, 0].tolist() == [255, 255, 255]
    palette = Image.new("P", (2, 2), 0)
    palette.putpalette([0, 0, 0] * 256)
    buffer = io.BytesIO()
    palette.save(buffer, format="PNG", transparency=0)
    assert np.asarray(load_image(buffer.getvalue()))[0, 0].tolist() == [255, 255, 255]


def test_sixteen_bit_images_keep_their_contrast() -> None:
    values = np.array([[0, 1000, 30000, 65535]], dtype=np.uint16)
    buffer = io.BytesIO()
    Image.fromarray(values).save(buffer, format="PNG")
    got = np.asarray(load_image(buffer.getvalue()))[0, :, 0]
    assert got.tolist() == [v // 257 for v in values[0].tolist()] == [0, 3, 116, 255]


def test_exif_orientation_is_applied_like_transformers() -> None:
    from transformers.image_utils import load_image as hf_load_image

    picture = Image.new("RGB", (40, 20), (255, 0, 0))
    picture.paste((0, 0, 255), (0, 0, 10, 20))  # a blue band on the left
    exif = picture.getexif()
    exif[0x0112] = 6  # stored sideways: rotate 90 degrees clockwise to view
    buffer = io.BytesIO()
    picture.save(buffer, format="PNG", exif=exif)
    got = load_image(buffer.getvalue())
    assert got.size == (20, 40)
    assert np.array_equal(np.asarray(got), np.asarray(hf_load_image(Image.open(io.BytesIO(buffer.getvalue())))))
    assert tuple(np.asarray(got)[0, 15]) == (0, 0, 255)  # the left band is now on top


def test_line_wrapped_base64_data_uri() -> None:
    data = _png_bytes()
    encoded = base64.encodebytes(data).decode()  # MIME style: a newline every 76 characters
    assert "\n" in encoded.strip()
    assert np.array_equal(np.asarray(load_image("data:image/png;base64," + encoded)), np.asarray(load_image(data)))


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 700), st.integers(1, 700))
def test_processing_vision_grid_predicts_what_process_images_makes(height: int, width: int) -> None:
    from rlloom.multimodal import QwenVLProcessing, process_images

    processing = QwenVLProcessing(min_pixels=56 * 56, max_pixels=28 * 28 * 64)
    if max(height, width) / min(height, width) > 60:  # the budget's floors must not push it over 200:1
        return
    _, grid = process_images([Image.new("RGB", (width, height))], processing)
    predicted = processing.vision_grid(height, width)
    assert predicted.grid_thw == tuple(grid[0].tolist())
    assert predicted.num_tokens == math.prod(predicted.grid_thw) // 4


def test_extreme_aspect_ratio_names_the_image_and_the_fix() -> None:
    from rlloom.multimodal import QwenVLProcessing, process_images

    with pytest.raises(ValueError, match=r"image 1 is 969x3 pixels .* 323:1.*crop or pad"):
        process_images([Image.new("RGB", (60, 60)), Image.new("RGB", (300, 1))], QwenVLProcessing())
    with pytest.raises(ValueError, match=r"1000x1 pixels .*crop or pad"):
        vision_grid(1, 1000)
