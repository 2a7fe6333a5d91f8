"""Load images from whatever a dataset row holds and fit them to a VLM's pixel budget.

Rows carry images as file paths, raw bytes, base64 data URIs or PIL images; every path through training must
see the same pixels, so loading and resizing live in one place. The token count of an image is derived from
transformers' own Qwen2-VL `smart_resize`, so the engine, the actor and validation agree by construction.
"""

from __future__ import annotations

import base64
import binascii
import io
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

ImageInput = str | Path | bytes | Image.Image | Mapping[str, Any]

# EasyR1's defaults: 512x512 .. 2048x2048 pixels.
DEFAULT_MIN_PIXELS = 512 * 512
DEFAULT_MAX_PIXELS = 2048 * 2048
_ORIENTATION = 0x0112  # the EXIF tag


def load_image(source: ImageInput) -> Image.Image:
    """Open a path, bytes, a `data:image/...;base64,` URI, a PIL image or a `{"bytes": ..., "path": ...}` dict (how
    HF datasets store an image column, e.g. hiyouga/geometry3k's parquet, which EasyR1 reads), fully decoded, as RGB.

    As transformers' `load_image` and qwen_vl_utils do: the EXIF orientation is applied (a phone photo stands the
    way it was taken) and transparent pixels are composited on white (a diagram with a transparent background
    would otherwise turn black, its black lines with it); 16-bit images keep their contrast (scaled to 8 bits,
    not clipped to white).
    """
    if isinstance(source, Mapping):
        source = _stored_image(source)
    if isinstance(source, Image.Image):
        image = source
    elif isinstance(source, bytes):
        image = _open_bytes(source, "raw bytes")
    elif isinstance(source, str) and source.startswith("data:image"):
        header, _, payload = source.partition(",")
        if ";base64" not in header:
            raise ValueError("image data URI must be base64 encoded: data:image/<type>;base64,<payload>")
        try:
            # line-wrapped base64 (the `base64` tool wraps at 76 columns) is still base64
            image = _open_bytes(base64.b64decode("".join(payload.split()), validate=True), "data URI")
        except binascii.Error as err:
            raise ValueError(f"image data URI has invalid base64: {err}") from err
    elif isinstance(source, str | Path):
        path = Path(source)
        if not path.is_file():
            raise FileNotFoundError(f"image file not found: {path}")
        image = _open_bytes(path.read_bytes(), str(path))
    else:  # a JSON row's number or null would otherwise end in a TypeError from pathlib
        raise ValueError(
            f"cannot load an image from a {type(source).__name__} ({str(source)[:60]!r}); give a file path, bytes, a "
            'data:image/...;base64 URI, a PIL image or a {"bytes": ..., "path": ...} dict'
        )
    image.load()
    return to_rgb(image)


def _stored_image(record: Mapping[str, Any]) -> ImageInput:
    """The bytes (else the path) of an HF datasets image dict, as EasyR1's `process_image` reads it."""
    if isinstance(record.get("bytes"), bytes):
        return record["bytes"]
    if isinstance(record.get("path"), str) and record["path"]:
        return record["path"]
    raise ValueError(
        f"image dict with keys {sorted(record)} has neither 'bytes' nor a 'path'; give "
        '{"bytes": <encoded image>} or {"path": <file>} (the HF datasets image layout)'
    )


def to_rgb(image: Image.Image) -> Image.Image:
    """Upright, 8-bit RGB: EXIF orientation applied, alpha composited on white, 16-bit scaled down."""
    if image.getexif().get(_ORIENTATION, 1) != 1:
        image = ImageOps.exif_transpose(image)
    if image.mode == "RGB":
        return image
    if image.mode.startswith("I;16") or image.mode == "I":  # 16-bit PNG/TIFF: convert() would clip at 255
        wide = np.asarray(image).astype(np.int64)
        image = Image.fromarray((np.clip(wide, 0, 65535) // 257).astype(np.uint8), mode="L")
    if image.mode in ("RGBA", "LA", "PA", "La", "RGBa") or "transparency" in image.info:
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        background.alpha_composite(rgba)
        return background.convert("RGB")
    return image.convert("RGB")


def _open_bytes(data: bytes, what: str) -> Image.Image:
    try:
        return Image.open(io.BytesIO(data))
    except UnidentifiedImageError:
        raise ValueError(f"cannot decode image from {what}: not an image format PIL reads (PNG, JPEG, ...)") from None
    except Exception as err:  # PIL raises several types for undecodable data
        raise ValueError(f"cannot decode image from {what}: {err}") from err


def fit_pixel_budget(
    image: Image.Image, *, min_pixels: int = DEFAULT_MIN_PIXELS, max_pixels: int = DEFAULT_MAX_PIXELS
) -> Image.Image:
    """Rescale by one factor (aspect ratio kept) so that width x height lies in [min_pixels, max_pixels]."""
    if not 0 < min_pixels <= max_pixels:
        raise ValueError(f"need 0 < min_pixels <= max_pixels, got {min_pixels} and {max_pixels}")
    size = fitted_size(image.width, image.height, min_pixels=min_pixels, max_pixels=max_pixels)
    if size == image.size:
        return image
    return image.resize(size, Image.Resampling.BICUBIC)


def fitted_size(width: int, height: int, *, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """The (width, height) `fit_pixel_budget` resizes to: one factor, each side floored (EasyR1's rule)."""
    area = width * height
    if area > max_pixels:
        scale = math.sqrt(max_pixels / area)
    elif area < min_pixels:
        scale = math.sqrt(min_pixels / area)
    else:
        return width, height
    return max(1, int(width * scale)), max(1, int(height * scale))


MAX_ASPECT_RATIO = 200  # Qwen2-VL's smart_resize refuses longer or thinner images


def check_aspect_ratio(width: int, height: int, what: str = "image") -> None:
    """Name the image and the fix where transformers' smart_resize would only say 'aspect ratio must be ...'."""
    ratio = max(width, height) / max(1, min(width, height))
    if ratio > MAX_ASPECT_RATIO:
        raise ValueError(
            f"{what} is {width}x{height} pixels (width x height, after the pixel budget), an aspect ratio of "
            f"{ratio:.0f}:1; Qwen2-VL's image processor refuses more than {MAX_ASPECT_RATIO}:1: crop or pad the image"
        )


@dataclass(frozen=True, slots=True)
class VisionGrid:
    """How a Qwen2-VL style vision tower tiles one image."""

    height: int  # after smart_resize
    width: int
    grid_thw: tuple[int, int, int]  # temporal, patch rows, patch columns
    num_tokens: int  # <|image_pad|> tokens the image expands to


def vision_grid(
    height: int,
    width: int,
    *,
    patch_size: int = 14,
    merge_size: int = 2,
    min_pixels: int = 56 * 56,
    max_pixels: int = 28 * 28 * 1280,
) -> VisionGrid:
    """The resized size, patch grid and image-token count Qwen2/2.5-VL's image processor gives an image of this
    size. `QwenVLProcessing.vision_grid` predicts `build_vision_inputs` instead, which fits the pixel budget first."""
    check_aspect_ratio(width, height)
    factor = patch_size * merge_size
    resized_h, resized_w = smart_resize(height, width, factor=factor, min_pixels=min_pixels, max_pixels=max_pixels)
    grid = (1, resized_h // patch_size, resized_w // patch_size)
    return VisionGrid(resized_h, resized_w, grid, grid[0] * grid[1] * grid[2] // (merge_size**2))
