"""Rollout and actor must agree: HFEngine's sampling logprobs on a VLM equal one teacher-forced forward's."""

from collections.abc import Iterator
from typing import Any

import pytest
import torch

from rlloom.core_rl.contracts.generation import GenerationRequest, SamplingParams
from rlloom.multimodal.qwen_vl import QwenVLProcessing, VisionInputs, VisionTokenIds, build_vision_inputs

hf_engine = pytest.importorskip("rlloom.rollout.hf.engine")  # rlloom-rollout is a test-time peer, not a dependency


@pytest.fixture(scope="module")
def inputs(tok: Any, processing: QwenVLProcessing, noise_image: Any) -> VisionInputs:
    content = [
        {"type": "image", "image": noise_image(100, 140)},
        {"type": "text", "text": "and"},
        {"type": "image", "image": noise_image(140, 90, seed=1)},
        {"type": "text", "text": "Find x."},
    ]
    return build_vision_inputs([{"role": "user", "content": content}], tok, processing)


@pytest.fixture
def engine(vlm: torch.nn.Module, tok: Any) -> Iterator[Any]:
    eng = hf_engine.HFEngine(vlm, tok)
    yield eng
    eng.close()


def _teacher_forced_logprobs(
    vlm: torch.nn.Module, inputs: VisionInputs, response: list[int], temperature: float
) -> torch.Tensor:
    """The actor's view: one forward over prompt + response, positions from the model's own get_rope_index."""
    ids = torch.tensor([inputs.input_ids + response])
    image_pad = VisionTokenIds.from_config(vlm.config).image_pad
    positions, _ = vlm.model.get_rope_index(
        ids, mm_token_type_ids=(ids == image_pad).int(), image_grid_thw=inputs.image_grid_thw
    )
    with torch.no_grad():
        logits = vlm(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            position_ids=positions,
            pixel_values=inputs.pixel_values,
            image_grid_thw=inputs.image_grid_thw,
        ).logits[0]
    n = len(inputs.input_ids)
    logp = torch.log_softmax(logits[n - 1 : -1].float() / temperature, dim=-1)
    return logp.gather(-1, torch.tensor(response)[:, None])[:, 0]


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_engine_logprobs_equal_a_teacher_forced_forward(
    engine: Any, vlm: torch.nn.Module, inputs: VisionInputs, temperature: float
) -> None:
    sampling = SamplingParams(n=3, max_tokens=16, temperature=temperature, seed=7, ignore_eos=True)
    request = GenerationRequest(prompt_ids=inputs.input_ids, multimodal=inputs.engine_inputs(), sampling=sampling)
    completions = engine.generate([request])[0]
    assert len({tuple(c.token_ids) for c in completions}) == 3
    for completion in completions:
        assert len(completion.token_ids) == 16
        expected = _teacher_forced_logprobs(vlm, inputs, completion.token_ids, temperature)
        torch.testing.assert_close(torch.tensor(completion.logprobs), expected, atol=1e-4, rtol=0)


def test_vision_tokens_are_never_sampled(engine: Any, vlm: torch.nn.Module, inputs: VisionInputs) -> None:
    """A generated <|image_pad|> would break the actor's forward (tokens != image features): it is banned."""
    banned = VisionTokenIds.from_config(vlm.config)
    saved = vlm.lm_head.weight[banned.image_pad].detach().clone()
    try:
        with torch.no_grad():  # make the image pad the greedy next token, by far (its logit becomes 50)
            hidden = vlm.model(
                input_ids=torch.tensor([inputs.input_ids]),
                position_ids=inputs.position_ids[:, None],
                pixel_values=inputs.pixel_values,
                image_grid_thw=inputs.image_grid_thw,
            ).last_hidden_state[0, -1]
            vlm.lm_head.weight[banned.image_pad] = hidden * 50 / hidden.norm() ** 2
        sampling = SamplingParams(n=1, max_tokens=1, temperature=0.0)
        request = GenerationRequest(prompt_ids=inputs.input_ids, multimodal=inputs.engine_inputs(), sampling=sampling)
        completion = engine.generate([request])[0][0]
        assert completion.token_ids[0] not in {banned.image_pad, banned.video_pad, banned.vision_start}
        expected = _teacher_forced_logprobs(vlm, inputs, completion.token_ids, 1.0)
        torch.testing.assert_close(torch.tensor(completion.logprobs), expected, atol=1e-4, rtol=0)
        assert completion.logprobs[0] < -20  # the pad holds nearly all the mass: the ban truly bit
    finally:
        with torch.no_grad():
            vlm.lm_head.weight[banned.image_pad] = saved
