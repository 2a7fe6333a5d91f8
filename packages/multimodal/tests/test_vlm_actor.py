"""Rollout and training agree on a VLM: the actor's log-probs of HFEngine's samples equal the engine's own, and
the critic's values equal a direct forward.

The trajectories carry `VisionInputs.engine_inputs()` in `Trajectory.multimodal`, so core-rl's forward gets the
image tensors and the prompt's M-RoPE positions, continued for the response the way the engine decoded it.
"""

import copy
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from rlloom.core_rl.config.schema import ActorConfig, AlgorithmConfig, CriticConfig
from rlloom.core_rl.contracts.batch import TrajectoryBatch
from rlloom.core_rl.contracts.generation import GenerationRequest, SamplingParams
from rlloom.core_rl.contracts.trajectory import Trajectory
from rlloom.core_rl.workers.actor import PolicyActor
from rlloom.core_rl.workers.critic import ValueCritic, ValueModel
from rlloom.multimodal.qwen_vl import QwenVLProcessing, VisionInputs, VisionTokenIds, build_vision_inputs

hf_engine = pytest.importorskip("rlloom.rollout.hf.engine")  # rlloom-rollout is a test-time peer, not a dependency

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def prompts(tok: Any, processing: QwenVLProcessing, noise_image: Any) -> list[VisionInputs]:
    """Two image prompts of different lengths (two images, then one smaller image)."""
    two = [
        {"type": "image", "image": noise_image(100, 140)},
        {"type": "text", "text": "and"},
        {"type": "image", "image": noise_image(140, 90, seed=1)},
        {"type": "text", "text": "Find x."},
    ]
    one = [{"type": "text", "text": "What is it?"}, {"type": "image", "image": noise_image(60, 70, seed=2)}]
    return [build_vision_inputs([{"role": "user", "content": c}], tok, processing) for c in (two, one)]


@pytest.fixture(scope="module")
def engine(vlm: torch.nn.Module, tok: Any) -> Iterator[Any]:
    eng = hf_engine.HFEngine(vlm, tok)
    yield eng
    eng.close()


def _sample(engine: Any, prompt_ids: list[int], multimodal: dict[str, Any] | None, n_tokens: int) -> Trajectory:
    sampling = SamplingParams(max_tokens=n_tokens, temperature=0.7, seed=3, ignore_eos=True)
    request = GenerationRequest(prompt_ids=prompt_ids, multimodal=multimodal, sampling=sampling)
    completion = engine.generate([request])[0][0]
    assert completion.logprobs is not None and len(completion.token_ids) == n_tokens
    return Trajectory(
        prompt_ids=list(completion.prompt_ids),
        response_ids=list(completion.token_ids),
        loss_mask=[1] * n_tokens,
        rollout_logprobs=list(completion.logprobs),
        multimodal=multimodal,
    )


@pytest.fixture(scope="module")
def trajectories(engine: Any, prompts: list[VisionInputs], tok: Any) -> list[Trajectory]:
    """A text-only trajectory between two VLM trajectories, every prompt and response of another length."""
    text_ids = tok("<|im_start|>user\nSolve 2+2.<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)
    return [
        _sample(engine, prompts[0].input_ids, prompts[0].engine_inputs(), 12),
        _sample(engine, list(text_ids["input_ids"]), None, 9),
        _sample(engine, prompts[1].input_ids, prompts[1].engine_inputs(), 5),
    ]


def _actor(model: torch.nn.Module, **actor_kwargs: Any) -> PolicyActor:
    algo = AlgorithmConfig(loss_agg_mode="token-mean")
    cfg = ActorConfig(lr=1e-3, ppo_epochs=1, mini_batch_size=3, shuffle=False, **actor_kwargs)
    return PolicyActor(
        model,  # type: ignore[arg-type]
        actor=cfg,
        algorithm=algo,
        total_steps=1,
        mini_batch_rows=3,
        max_response_length=12,
        device=CPU,
        bf16=False,
    )


def _max_gap(actor: PolicyActor, trajectories: list[Trajectory], pad_token_id: int) -> float:
    batch = TrajectoryBatch.from_trajectories(trajectories, pad_token_id)
    logprobs, entropy = actor.compute_logprobs(batch, temperature=0.7, entropy=True)
    assert entropy is not None and entropy.shape == logprobs.shape
    mask = batch.response_attention_mask.bool()
    assert not logprobs[~mask].any() and not entropy[~mask].any()  # padding stays 0
    assert bool((entropy[mask] > 0).all())
    return float((logprobs - batch["rollout_logprobs"])[mask].abs().max())


@pytest.mark.parametrize("padding_free", [False, True])
def test_actor_logprobs_equal_rollout_logprobs(
    vlm: torch.nn.Module, tok: Any, trajectories: list[Trajectory], padding_free: bool
) -> None:
    actor = _actor(copy.deepcopy(vlm), padding_free=padding_free)
    assert _max_gap(actor, trajectories, tok.pad_token_id) < 1e-4  # mixed: text row batched, VLM rows alone
    for one in trajectories:
        assert _max_gap(actor, [one], tok.pad_token_id) < 1e-4


def test_actor_needs_images_and_rope_positions(vlm: torch.nn.Module, tok: Any, trajectories: list[Trajectory]) -> None:
    """Without the images, or with plain 1-D positions, the match breaks: the test above is sensitive to both."""
    actor = _actor(copy.deepcopy(vlm))
    inputs = dict(trajectories[0].multimodal or {})
    n_prompt = len(trajectories[0].prompt_ids)
    flat = torch.arange(n_prompt).expand(3, -1)
    for multimodal in ({"position_ids": inputs["position_ids"]}, {**inputs, "position_ids": flat}):
        changed = copy.copy(trajectories[0])
        changed.multimodal = multimodal
        assert _max_gap(actor, [changed], tok.pad_token_id) > 1e-3


def test_bad_positions_are_named(vlm: torch.nn.Module, tok: Any, trajectories: list[Trajectory]) -> None:
    actor = _actor(copy.deepcopy(vlm))
    short = copy.copy(trajectories[0])
    short.multimodal = {**trajectories[0].multimodal, "position_ids": torch.zeros(3, 4, dtype=torch.long)}  # type: ignore[dict-item]
    with pytest.raises(ValueError, match=r"multimodal\['position_ids'\]"):
        _max_gap(actor, [short], tok.pad_token_id)


def test_update_policy_trains_the_vision_tower(vlm: torch.nn.Module, tok: Any, trajectories: list[Trajectory]) -> None:
    model = copy.deepcopy(vlm)
    actor = _actor(model)
    batch = TrajectoryBatch.from_trajectories(trajectories, tok.pad_token_id)
    old, _ = actor.compute_logprobs(batch, temperature=0.7)
    batch["old_logprobs"] = old
    batch["advantages"] = torch.tensor([[1.0], [-1.0], [1.0]]) * batch.loss_mask
    before = {k: v.detach().clone() for k, v in model.named_parameters()}
    metrics = actor.update_policy(batch, temperature=0.7)
    assert metrics["actor/grad_norm"] > 0 and metrics["actor/grad_norm_nonfinite"] == 0
    changed = {k for k, v in model.named_parameters() if not torch.equal(v, before[k])}
    assert any(".visual." in k or k.startswith("visual.") for k in changed), "no gradient reached the vision tower"
    assert any("language_model" in k for k in changed)
    new, _ = actor.compute_logprobs(batch, temperature=0.7)
    mask = batch.loss_mask.bool()
    # a step up the advantage: the positive rows' (image rows) log-probs rise on average
    assert float((new - old)[0][mask[0]].mean()) > 0 and float((new - old)[2][mask[2]].mean()) > 0


def test_critic_values_match_a_direct_forward_and_train_the_vision_tower(
    vlm: torch.nn.Module, tok: Any, trajectories: list[Trajectory]
) -> None:
    """PPO's critic on the same mixed batch: each row's values equal the backbone run on that row alone with the
    model's own `get_rope_index` positions, and the value loss reaches the vision tower."""
    backbone = copy.deepcopy(vlm.model)  # the image-text model without its LM head, as AutoModel loads it
    value_model = ValueModel(backbone)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        torch.nn.init.normal_(value_model.value_head.weight, std=0.5)  # a zero head would make every value 0
    critic = ValueCritic(
        value_model,
        critic=CriticConfig(lr=1e-3, ppo_epochs=1, mini_batch_size=3, shuffle=False),
        loss_agg_mode="token-mean",
        total_steps=1,
        mini_batch_rows=3,
        device=CPU,
        bf16=False,
    )
    batch = TrajectoryBatch.from_trajectories(trajectories, tok.pad_token_id)
    values = critic.compute_values(batch)
    image_pad = VisionTokenIds.from_config(vlm.config).image_pad
    for row, traj in enumerate(trajectories):
        ids = torch.tensor([traj.prompt_ids + traj.response_ids])
        kwargs: dict[str, Any] = {}
        if traj.multimodal:
            grid = traj.multimodal["image_grid_thw"]
            tokens = (ids == image_pad).int()
            positions, _ = vlm.model.get_rope_index(ids, mm_token_type_ids=tokens, image_grid_thw=grid)
            pixels = traj.multimodal["pixel_values"]
            kwargs = {"position_ids": positions, "pixel_values": pixels, "image_grid_thw": grid}
        with torch.no_grad():
            hidden = backbone(input_ids=ids, **kwargs).last_hidden_state[0]
            n_p, n_r = len(traj.prompt_ids), len(traj.response_ids)
            expected = value_model.value_head(hidden[n_p - 1 : n_p - 1 + n_r]).squeeze(-1)
        torch.testing.assert_close(values[row, :n_r], expected, rtol=1e-4, atol=1e-5)
        assert not values[row, n_r:].any()

    batch["values"] = values
    batch["returns"] = (values + 1.0) * batch.loss_mask
    before = {k: v.detach().clone() for k, v in backbone.named_parameters() if "visual" in k}
    metrics = critic.update_critic(batch)
    assert metrics["critic/vf_loss"] > 0
    assert any(not torch.equal(v, before[k]) for k, v in backbone.named_parameters() if k in before)


def test_a_frozen_vision_tower_stays_put_while_the_language_model_trains(
    tmp_path: Any, tok: Any, trajectories: list[Trajectory]
) -> None:
    """model.freeze_vision_tower (EasyR1's): loaded through core-rl's loader, an update moves the language model and
    leaves every vision-encoder weight exactly as it was; a text model asking for it is refused."""
    from rlloom.core_rl.config.schema import ConfigError, ModelConfig
    from rlloom.core_rl.tiny import save_tiny_model
    from rlloom.core_rl.workers.actor import load_causal_lm
    from rlloom.multimodal.tiny import save_tiny_vl_model

    saved = save_tiny_vl_model(tmp_path / "vl")
    model = load_causal_lm(ModelConfig(path=str(saved.model), freeze_vision_tower=True), str(saved.model), CPU)
    frozen = {k for k, v in model.named_parameters() if not v.requires_grad}
    assert frozen and all(".visual." in f".{k}" for k in frozen)
    actor = _actor(model)
    batch = TrajectoryBatch.from_trajectories(trajectories, tok.pad_token_id)
    old, _ = actor.compute_logprobs(batch, temperature=0.7)
    batch["old_logprobs"] = old
    batch["advantages"] = torch.tensor([[1.0], [-1.0], [1.0]]) * batch.loss_mask
    before = {k: v.detach().clone() for k, v in model.named_parameters()}
    actor.update_policy(batch, temperature=0.7)
    changed = {k for k, v in model.named_parameters() if not torch.equal(v, before[k])}
    assert changed and not changed & frozen  # the language model moved, the vision tower did not
    assert any("language_model" in k for k in changed)

    text = save_tiny_model(tmp_path / "text")
    with pytest.raises(ConfigError, match="model.freeze_vision_tower: the model has no vision tower"):
        load_causal_lm(ModelConfig(path=str(text.model), freeze_vision_tower=True), str(text.model), CPU)
