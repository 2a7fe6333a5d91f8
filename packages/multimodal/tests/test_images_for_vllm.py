"""The collector's image requests in the form vLLM's Qwen-VL processor takes (`rlloom.rollout.vllm.images`), without
vLLM: images rebuilt from the actor's patches are cut into the very same patches by the image processor, and each
image's run of pads collapses to the one pad vLLM re-expands. `test_vllm_images.py` runs them through vLLM."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from rlloom.core_rl.tiny import char_tokenizer, tiny_qwen2
from rlloom.multimodal.qwen_vl import QwenVLProcessing, VisionTokenIds, build_vision_inputs, process_images
from rlloom.multimodal.tiny import tiny_qwen2_5_vl
from rlloom.rollout.vllm.images import (
    ImagePatchLayout,
    collapse_image_pads,
    images_from_patches,
    vllm_image_prompt,
)


def _layout(tok: Any) -> ImagePatchLayout:
    return ImagePatchLayout(image_token_id=VisionTokenIds.from_tokenizer(tok).image_pad)


def test_rebuilt_images_give_back_the_same_patches(processing: QwenVLProcessing, noise_image: Any, tok: Any) -> None:
    images = [noise_image(100, 140, seed=1), noise_image(300, 90, seed=2)]  # fitted, then resized by the processor
    pixels, grid = process_images(images, processing)
    rebuilt = images_from_patches(pixels, grid, _layout(tok))
    # each at its processed size: patch 14 x grid, sides multiples of 28
    assert [(im.height, im.width) for im in rebuilt] == [(h * 14, w * 14) for _, h, w in grid.tolist()]
    again, again_grid = process_images(rebuilt, processing)
    assert torch.equal(again_grid, grid)
    assert torch.equal(again, pixels)  # bit for bit: the pixels were uint8 before normalisation


def test_pads_collapse_to_one_per_image_and_bad_runs_are_named(tok: Any) -> None:
    pad = VisionTokenIds.from_tokenizer(tok).image_pad
    expanded = [1, 2, pad, pad, pad, 3, pad, pad, 4]
    assert collapse_image_pads(expanded, [3, 2], pad) == [1, 2, pad, 3, pad, 4]
    assert collapse_image_pads([pad] * 5, [3, 2], pad) == [pad, pad]  # adjacent images share one run
    with pytest.raises(ValueError, match="image 1 needs a run of 4"):
        collapse_image_pads(expanded, [3, 4], pad)
    with pytest.raises(ValueError, match="runs for 1 images but 2 were given"):
        collapse_image_pads([1, pad, pad, 2], [2, 2], pad)


def test_a_collector_request_becomes_one_pad_per_image_plus_its_images(
    tok: Any, processing: QwenVLProcessing, noise_image: Any
) -> None:
    messages = [
        {"role": "user", "content": [{"type": "image", "image": noise_image(100, 140)}, {"type": "text", "text": "hi"}]}
    ]
    inputs = build_vision_inputs(messages, tok, processing)
    prompt = vllm_image_prompt(inputs.input_ids, inputs.engine_inputs(), _layout(tok))
    raw = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert prompt["prompt_token_ids"] == tok(raw, add_special_tokens=False)["input_ids"]  # the template's own ids
    assert [im.size for im in prompt["multi_modal_data"]["image"]] == [(112, 84)]
    with pytest.raises(ValueError, match="no vision_config"):
        vllm_image_prompt(inputs.input_ids, inputs.engine_inputs(), None)
    with pytest.raises(ValueError, match="take the vision collector.s"):
        vllm_image_prompt(inputs.input_ids, {"images": []}, _layout(tok))


def test_layout_is_read_from_a_saved_model(tok: Any, tmp_path: Any) -> None:
    tiny_qwen2_5_vl(tok).save_pretrained(tmp_path)
    layout = ImagePatchLayout.from_model(str(tmp_path))
    ids = VisionTokenIds.from_tokenizer(tok)
    banned = tuple(sorted((ids.image_pad, ids.video_pad, ids.vision_start)))  # never sampled, as by HFEngine
    assert layout == ImagePatchLayout(image_token_id=ids.image_pad, banned_token_ids=banned)
    assert layout.logit_bias() == dict.fromkeys(banned, -100.0)
    tiny_qwen2(char_tokenizer()).save_pretrained(tmp_path / "text")
    assert ImagePatchLayout.from_model(str(tmp_path / "text")) is None  # a text model sends no images
