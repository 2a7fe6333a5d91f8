"""Shared fixtures: the tiny in-process VLMs (Qwen2.5-VL and Qwen2-VL: every test that takes `vlm` runs on both),
their character tokenizer and synthetic images."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from rlloom.multimodal.qwen_vl import QwenVLProcessing
from rlloom.multimodal.tiny import qwen_vl_char_tokenizer, tiny_qwen2_5_vl, tiny_qwen2_vl


@pytest.fixture(scope="session")
def tok() -> Any:
    return qwen_vl_char_tokenizer()


@pytest.fixture(scope="session", params=["qwen2_5_vl", "qwen2_vl"])
def vlm(tok: Any, request: pytest.FixtureRequest) -> torch.nn.Module:
    build = tiny_qwen2_5_vl if request.param == "qwen2_5_vl" else tiny_qwen2_vl
    return build(tok, seed=0).eval()


@pytest.fixture(scope="session")
def processing() -> QwenVLProcessing:
    """A small budget: a 100 x 140 image becomes 84 x 112 pixels, a 6 x 8 patch grid, 12 image tokens."""
    return QwenVLProcessing(min_pixels=56 * 56, max_pixels=10_000)


def _noise_image(height: int, width: int, seed: int = 0) -> Image.Image:
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    return Image.fromarray(pixels)


@pytest.fixture(scope="session")
def noise_image() -> Any:
    """`noise_image(height, width, seed)`: random RGB pixels, so the ViT's output shows in the logits."""
    return _noise_image
