"""The vision collector: EasyR1-style rows -> engine requests with images -> core-rl trajectories.

Checked against independent expectations: the marker split by hand, image-token counts from the grid arithmetic,
group ids and fields as core-rl's `single_turn_collector` writes them, and text rows through core-rl's own path.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch

from rlloom.core_rl.contracts.generation import SamplingParams
from rlloom.core_rl.phases.collection import single_turn_collector
from rlloom.multimodal.collection import drop_overlong_rows, split_image_markers, vision_collector, vision_messages
from rlloom.multimodal.qwen_vl import QwenVLProcessing, VisionTokenIds

hf_engine = pytest.importorskip("rlloom.rollout.hf.engine")  # rlloom-rollout is a test-time peer, not a dependency


def test_markers_split_into_content_parts() -> None:
    assert split_image_markers("<image>Find x.") == [{"type": "image"}, {"type": "text", "text": "Find x."}]
    assert split_image_markers("A<image>and<image>") == [
        {"type": "text", "text": "A"},
        {"type": "image"},
        {"type": "text", "text": "and"},
        {"type": "image"},
    ]
    assert split_image_markers("no image") == [{"type": "text", "text": "no image"}]
    messages = vision_messages({"prompt": "<image>Hi"})
    assert messages == [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Hi"}]}]


@pytest.fixture
def engine(vlm: torch.nn.Module, tok: Any) -> Iterator[Any]:
    eng = hf_engine.HFEngine(vlm, tok)
    yield eng
    eng.close()


def _rows(noise_image: Any) -> list[dict[str, Any]]:
    return [
        {
            "data_source": "geometry3k",
            "prompt": [{"role": "user", "content": "<image>Find x."}],
            "images": [noise_image(100, 140)],
            "reward_model": {"ground_truth": ["80", "D"]},
            "extra_info": {"id": 1},
        },
        {"data_source": "gsm8k", "prompt": "2+2=", "reward_model": {"ground_truth": "4"}, "extra_info": {"id": 2}},
        {
            "prompt": [{"role": "user", "content": "<image>and<image>?"}],
            "images": [noise_image(60, 70, seed=2), noise_image(140, 90, seed=1)],
            "ground_truth": "5",
        },
    ]


def test_collector_builds_vision_trajectories(
    engine: Any, tok: Any, processing: QwenVLProcessing, noise_image: Any
) -> None:
    rows = _rows(noise_image)
    sampling = SamplingParams(n=2, max_tokens=4, temperature=1.0, seed=0, ignore_eos=True)
    trajectories = vision_collector(tok, processing)(engine)(rows, sampling, "s1r1")
    assert [t.group_id for t in trajectories] == ["s1r1-0", "s1r1-0", "s1r1-1", "s1r1-1", "s1r1-2", "s1r1-2"]
    pad = VisionTokenIds.from_tokenizer(tok).image_pad
    # 100x140 -> 84x112 pixels: a 6x8 patch grid, 12 tokens; 60x70 -> 56x56 (the 56^2 floor): 4x4, 4 tokens;
    # 140x90 -> 112x84: 8x6, 12 tokens (smart_resize rounds each side to a multiple of 28)
    expected = [([[1, 6, 8]], 12), None, ([[1, 4, 4], [1, 8, 6]], 16)]
    for row_index, want in enumerate(expected):
        pair = trajectories[2 * row_index : 2 * row_index + 2]
        assert pair[0].multimodal is pair[1].multimodal  # n samples share the row's tensors
        if want is None:
            assert pair[0].multimodal is None
            continue
        grid, tokens = want
        mm = pair[0].multimodal
        assert mm is not None and set(mm) == {"pixel_values", "image_grid_thw", "position_ids"}
        assert mm["image_grid_thw"].tolist() == grid
        assert sum(1 for t in pair[0].prompt_ids if t == pad) == tokens
        assert mm["position_ids"].shape == (3, len(pair[0].prompt_ids))
        assert mm["pixel_values"].shape[0] == sum(t * h * w for t, h, w in grid)
    first = trajectories[0]
    assert first.data_source == "geometry3k" and first.ground_truth == ["80", "D"]
    assert first.extra_info == {"id": 1} and first.extra_info is not rows[0]["extra_info"]
    assert first.rollout_logprobs is not None and len(first.rollout_logprobs) == len(first.response_ids) == 4
    assert first.loss_mask == [1] * 4 and first.finish_reason == "length" and isinstance(first.response_text, str)
    assert trajectories[4].ground_truth == "5" and trajectories[4].data_source == ""


def test_text_rows_take_core_rls_path(engine: Any, tok: Any, processing: QwenVLProcessing, noise_image: Any) -> None:
    text_row = [_rows(noise_image)[1]]
    sampling = SamplingParams(n=2, max_tokens=5, temperature=1.0, seed=3, ignore_eos=True)
    ours = vision_collector(tok, processing)(engine)(text_row, sampling, "p")
    theirs = single_turn_collector(engine)(text_row, sampling, "p")
    assert [(t.prompt_ids, t.response_ids, t.rollout_logprobs, t.group_id) for t in ours] == [
        (t.prompt_ids, t.response_ids, t.rollout_logprobs, t.group_id) for t in theirs
    ]


def test_overlong_prompts_fail_in_the_collector_and_are_dropped_up_front(
    engine: Any, tok: Any, noise_image: Any
) -> None:
    rows = _rows(noise_image)
    # one token per character: "<|im_start|>user\n" 6 + vision start, 12 pads, end 14 + "Find x." 7
    # + "<|im_end|>\n" 2 + "<|im_start|>assistant\n" 11 = 40; the two-image row 6+6+3+14+1+2+11 = 43; "2+2=" 23
    tight = QwenVLProcessing(min_pixels=56 * 56, max_pixels=10_000, max_prompt_tokens=39)
    collect = vision_collector(tok, tight)(engine)
    with pytest.raises(ValueError, match=r"extra_info.id=1.*40 tokens.*over the limit of 39.*never truncate"):
        collect([rows[0]], SamplingParams(max_tokens=2), "p")
    assert drop_overlong_rows(rows, tok, tight) == rows[1:2]
    assert drop_overlong_rows(rows, tok, tight.model_copy(update={"max_prompt_tokens": 40})) == rows[:2]
    assert drop_overlong_rows(rows, tok, tight.model_copy(update={"max_prompt_tokens": 43})) == rows


def test_bad_image_rows_name_the_row_and_the_fix(tok: Any, noise_image: Any, tmp_path: Any) -> None:
    from rlloom.multimodal.collection import row_request

    processing = QwenVLProcessing(min_pixels=56 * 56, max_pixels=10_000)
    sampling = SamplingParams(max_tokens=2)
    two_markers = {"prompt": "<image><image>Which?", "images": [noise_image(60, 60)], "extra_info": {"id": 7}}
    with pytest.raises(ValueError, match=r"extra_info.id=7.*2 <image> markers .* 'images' lists 1"):
        row_request(two_markers, sampling, tok, processing)
    no_marker = {"prompt": "Which?", "images": [noise_image(60, 60)], "extra_info": {"id": 8}}
    with pytest.raises(ValueError, match=r"extra_info.id=8.*0 <image> markers .* 'images' lists 1"):
        row_request(no_marker, sampling, tok, processing)
    moved = {"prompt": "<image>Which?", "images": [str(tmp_path / "gone.png")], "extra_info": {"id": 9}}
    with pytest.raises(ValueError, match=r"extra_info.id=9.*image file not found: .*gone.png"):
        row_request(moved, sampling, tok, processing)  # a FileNotFoundError with no row named, before


def test_chat_template_variables_reach_image_and_text_prompts(processing: QwenVLProcessing, noise_image: Any) -> None:
    """`QwenVLProcessing.chat_template_kwargs` (data.apply_chat_template_kwargs): image prompts, text prompts and
    the collector the trainer checks all carry them."""
    from rlloom.multimodal.collection import row_request
    from rlloom.multimodal.qwen_vl import build_vision_inputs
    from rlloom.multimodal.tiny import qwen_vl_char_tokenizer

    tok = qwen_vl_char_tokenizer()
    tok.chat_template += "{% if style is defined %}{{ style }}{% endif %}"
    styled = QwenVLProcessing(**{**processing.model_dump(), "chat_template_kwargs": {"style": "brief:"}})
    parts = [{"type": "image", "image": noise_image(56, 56)}, {"type": "text", "text": "Q"}]
    messages = [{"role": "user", "content": parts}]
    plain_ids = build_vision_inputs(messages, tok, processing).input_ids
    styled_ids = build_vision_inputs(messages, tok, styled).input_ids
    assert styled_ids == plain_ids + tok("brief:", add_special_tokens=False)["input_ids"]
    text_row = {"prompt": "hi", "data_source": "x", "reward_model": {"ground_truth": "y"}}
    assert row_request(text_row, SamplingParams(), tok, styled).chat_template_kwargs == {"style": "brief:"}
    assert vision_collector(tok, styled).chat_template_kwargs == {"style": "brief:"}  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="add_generation_prompt cannot be set there"):
        QwenVLProcessing(chat_template_kwargs={"add_generation_prompt": False})
