from typing import Any

import pytest
import torch

from rlloom.multimodal.qwen_vl import (
    QwenVLProcessing,
    VisionTokenIds,
    build_vision_inputs,
    check_vision_tokens,
    expand_image_pads,
    image_token_counts,
    mrope_position_ids,
    process_images,
    with_text_row,
)


def _messages(*images: Any, text: str = "Find x.") -> list[dict[str, Any]]:
    parts = [{"type": "image", "image": i} for i in images]
    return [{"role": "user", "content": [*parts, {"type": "text", "text": text}]}]


def _hf_rope_index(vlm: torch.nn.Module, ids: list[int], grid: torch.Tensor, image_pad: int) -> Any:
    """The model's own M-RoPE positions (mm_token_type_ids: 1 on image tokens)."""
    input_ids = torch.tensor([ids])
    return vlm.model.get_rope_index(input_ids, mm_token_type_ids=(input_ids == image_pad).int(), image_grid_thw=grid)


def test_tokenizer_renders_image_parts_like_qwen(tok: Any) -> None:
    ids = tok.apply_chat_template(_messages("unused"), tokenize=False, add_generation_prompt=True)
    assert (
        ids == "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>Find x.<|im_end|>\n<|im_start|>assistant\n"
    )
    vision = VisionTokenIds.from_tokenizer(tok)
    encoded = tok("<|vision_start|><|image_pad|><|vision_end|>a", add_special_tokens=False)["input_ids"]
    assert encoded[:3] == [vision.vision_start, vision.image_pad, vision.vision_end]
    assert tok.decode(encoded, skip_special_tokens=True) == "a"


def test_expansion_counts_match_hand_computed_grids(tok: Any, processing: QwenVLProcessing, noise_image: Any) -> None:
    # 100 x 140 (h x w) is over 10_000 pixels, so smart_resize scales by sqrt(14_000 / 10_000) = 1.18 and floors
    # to multiples of 28: 84 x 112 -> 6 x 8 patches of 14 -> 48 patches, 48 / 2^2 = 12 tokens. 56 x 56 is the
    # minimum already: 4 x 4 patches -> 4 tokens.
    big, small = noise_image(100, 140), noise_image(56, 56, seed=1)
    pixel_values, grid = process_images([big, small], processing)
    assert grid.tolist() == [[1, 6, 8], [1, 4, 4]]
    assert pixel_values.shape == (48 + 16, 3 * 2 * 14 * 14)
    assert image_token_counts(grid, merge_size=2) == [12, 4]

    inputs = build_vision_inputs(_messages(big, small), tok, processing)
    vision = VisionTokenIds.from_tokenizer(tok)
    raw = tok(
        tok.apply_chat_template(_messages(big, small), tokenize=False, add_generation_prompt=True),
        add_special_tokens=False,
    )["input_ids"]
    assert len(inputs.input_ids) == len(raw) - 2 + 12 + 4
    first = inputs.input_ids.index(vision.image_pad)
    assert inputs.input_ids[first - 1] == vision.vision_start
    assert inputs.input_ids[first : first + 12] == [vision.image_pad] * 12
    assert inputs.input_ids[first + 12] == vision.vision_end
    assert inputs.input_ids.count(vision.image_pad) == 16
    assert inputs.position_ids.shape == (3, len(inputs.input_ids))


def test_images_can_come_from_a_separate_list(tok: Any, processing: QwenVLProcessing, noise_image: Any) -> None:
    image = noise_image(100, 140)
    inline = build_vision_inputs(_messages(image), tok, processing)
    listed = build_vision_inputs([{"role": "user", "content": [{"type": "image"}]}], tok, processing, images=[image])
    assert torch.equal(inline.pixel_values, listed.pixel_values)
    with pytest.raises(ValueError, match="ran out"):
        build_vision_inputs([{"role": "user", "content": [{"type": "image"}]}], tok, processing)
    with pytest.raises(ValueError, match="no image content part"):
        build_vision_inputs([{"role": "user", "content": "hi"}], tok, processing)


def test_mismatched_vision_tokens_name_the_fix(tok: Any, processing: QwenVLProcessing, noise_image: Any) -> None:
    vision = VisionTokenIds.from_tokenizer(tok)
    inputs = build_vision_inputs(_messages(noise_image(100, 140)), tok, processing)
    first = inputs.input_ids.index(vision.image_pad)
    truncated = inputs.input_ids[: first + 5]  # cut through the image's 12 tokens
    with pytest.raises(ValueError, match=r"holds 5 <\|image_pad\|> tokens .* need 12 .*lower max_pixels"):
        check_vision_tokens(truncated, inputs.image_grid_thw, vision, merge_size=2)
    with pytest.raises(ValueError, match=r"over the limit of 20: raise the max prompt length or lower max_pixels"):
        build_vision_inputs(
            _messages(noise_image(100, 140)), tok, processing.model_copy(update={"max_prompt_tokens": 20})
        )
    with pytest.raises(ValueError, match="video"):
        check_vision_tokens([*inputs.input_ids, vision.video_pad], inputs.image_grid_thw, vision, merge_size=2)
    split = inputs.input_ids[:first] + [vision.image_pad] * 6 + [5] + [vision.image_pad] * 6
    with pytest.raises(ValueError, match="do not split"):
        check_vision_tokens(split, inputs.image_grid_thw, vision, merge_size=2)
    with pytest.raises(ValueError, match="2 images were given"):
        expand_image_pads([1, vision.image_pad, 2], [12, 4], vision.image_pad)


@pytest.mark.parametrize("sizes", [[(100, 140)], [(100, 140), (56, 56)], [(140, 100), (90, 300)]])
def test_positions_match_the_models_get_rope_index(
    tok: Any, vlm: torch.nn.Module, processing: QwenVLProcessing, noise_image: Any, sizes: list[tuple[int, int]]
) -> None:
    images = [noise_image(h, w, seed=i) for i, (h, w) in enumerate(sizes)]
    inputs = build_vision_inputs(_messages(*images, text="Which is larger?"), tok, processing)
    image_pad = VisionTokenIds.from_config(vlm.config).image_pad
    expected, delta = _hf_rope_index(vlm, inputs.input_ids, inputs.image_grid_thw, image_pad)
    assert torch.equal(inputs.position_ids, expected[:, 0])
    assert inputs.rope_delta == int(delta)

    response = tok("x = 4", add_special_tokens=False)["input_ids"]
    full, _ = _hf_rope_index(vlm, inputs.input_ids + response, inputs.image_grid_thw, image_pad)
    assert torch.equal(inputs.positions_with_response(len(response)), full[:, 0])
    n = len(inputs.input_ids)
    assert full[:, 0, n:].tolist() == [[n + inputs.rope_delta + i for i in range(len(response))]] * 3


def test_pure_positions_need_whole_images(tok: Any, processing: QwenVLProcessing, noise_image: Any) -> None:
    inputs = build_vision_inputs(_messages(noise_image(100, 140)), tok, processing)
    image_pad = VisionTokenIds.from_tokenizer(tok).image_pad
    cut = inputs.input_ids[: inputs.input_ids.index(image_pad) + 3]
    with pytest.raises(ValueError, match="cut short"):
        mrope_position_ids(cut, inputs.image_grid_thw, image_pad, merge_size=2)


def test_explicit_positions_change_the_logits_and_the_packed_layout_does_not(
    tok: Any, vlm: torch.nn.Module, processing: QwenVLProcessing, noise_image: Any
) -> None:
    inputs = build_vision_inputs(_messages(noise_image(100, 140)), tok, processing)
    ids = torch.tensor([inputs.input_ids])
    images = {"pixel_values": inputs.pixel_values, "image_grid_thw": inputs.image_grid_thw}
    with torch.no_grad():
        three = vlm(input_ids=ids, position_ids=inputs.position_ids[:, None], **images).logits
        four = vlm(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            position_ids=with_text_row(inputs.position_ids[:, None]),
            **images,
        ).logits
    assert torch.equal(three, four)
    # why positions must always be passed explicitly: without them (and mm_token_type_ids) transformers 5.23
    # quietly uses 1-D positions for Qwen2.5-VL and refuses for Qwen2-VL
    vlm.model.rope_deltas = None
    if vlm.config.model_type == "qwen2_vl":
        with pytest.raises(ValueError, match="mm_token_type_ids"), torch.no_grad():
            vlm(input_ids=ids, **images)
    else:
        with torch.no_grad():
            inferred = vlm(input_ids=ids, **images).logits
        assert not torch.allclose(three, inferred, atol=1e-5)


def test_openai_image_url_parts_are_read_as_image_parts(
    tok: Any, processing: QwenVLProcessing, noise_image: Any, tmp_path: Any
) -> None:
    import base64
    import io

    image = noise_image(100, 140)
    path = tmp_path / "diagram.png"
    image.save(path)
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    data_uri = "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()
    reference = build_vision_inputs(_messages(str(path)), tok, processing)
    for url in (str(path), f"file://{path}", data_uri):
        parts = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "Find x."}]
        got = build_vision_inputs([{"role": "user", "content": parts}], tok, processing)
        assert got.input_ids == reference.input_ids
        assert torch.equal(got.pixel_values, reference.pixel_values)
    web = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://x.org/a.png"}}]}]
    with pytest.raises(ValueError, match="images are not downloaded; give a local path or a data: URI"):
        build_vision_inputs(web, tok, processing)
