"""Vision-language rows on FSDP2 ranks: the sharded actor and critic give the in-process workers' figures.

Each image row is a forward of its own, so the ranks cut their rows into micro-batches of one forward each and
pad with weight-0 single-row forwards to the same count; the vision tower stays in the root FSDP2 unit, and
unused parameters reduce zeros, so ranks with and without images in a micro-batch meet in the same collectives.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from rlloom.core_rl.config.schema import RLConfig
from rlloom.core_rl.contracts.batch import TrajectoryBatch
from rlloom.core_rl.contracts.trajectory import Trajectory
from rlloom.core_rl.workers.actor import PolicyActor, load_causal_lm
from rlloom.core_rl.workers.critic import ValueCritic, ValueModel
from rlloom.multimodal.qwen_vl import QwenVLProcessing, build_vision_inputs
from rlloom.multimodal.tiny import save_tiny_vl_model

ray = pytest.importorskip("ray")
from rlloom.core_rl.distributed.ray_group import RayActorGroup  # noqa: E402
from rlloom.core_rl.distributed.ray_start import start_ray  # noqa: E402

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow, pytest.mark.ray]
CPU = torch.device("cpu")


@pytest.fixture(scope="module", autouse=True)
def local_ray() -> Iterator[None]:
    start_ray(None, num_cpus=2, include_dashboard=False, log_to_driver=False)  # retried once on a busy machine
    yield
    ray.shutdown()


def vision_trajectories(tok: Any, noise_image: Any) -> list[Trajectory]:
    """Three image rows (one with two images) and two text rows, every length different."""
    processing = QwenVLProcessing(min_pixels=56 * 56, max_pixels=10_000)
    gen = torch.Generator().manual_seed(0)
    trajs = []
    specs = [[(100, 140)], None, [(140, 90), (56, 56)], None, [(60, 70)]]
    for i, sizes in enumerate(specs):
        response = torch.randint(10, 60, (4 + i,), generator=gen).tolist()
        if sizes is None:
            prompt = tok(f"<|im_start|>user\nSolve {i}+{i}.<|im_end|>\n", add_special_tokens=False)["input_ids"]
            trajs.append(Trajectory(prompt_ids=list(prompt), response_ids=response, loss_mask=[1] * len(response)))
            continue
        content = [{"type": "image", "image": noise_image(h, w, seed=i + j)} for j, (h, w) in enumerate(sizes)]
        messages = [{"role": "user", "content": [*content, {"type": "text", "text": "x?"}]}]
        inputs = build_vision_inputs(messages, tok, processing)
        trajs.append(
            Trajectory(
                prompt_ids=inputs.input_ids,
                response_ids=response,
                loss_mask=[1] * len(response),
                multimodal=inputs.engine_inputs(),
            )
        )
    return trajs


def test_vlm_rows_on_two_ranks_match_the_in_process_actor(tok: Any, noise_image: Any, tmp_path: Path) -> None:
    saved = save_tiny_vl_model(tmp_path)
    cfg = RLConfig.model_validate(
        {
            "model": {"path": str(saved.model), "tokenizer_path": str(saved.tokenizer)},
            "rollout": {"n": 1, "max_tokens": 8},
            "algorithm": {"adv_estimator": "reinforce_plus_plus"},  # one sample per prompt: no groups
            "actor": {"lr": 1e-3, "ppo_epochs": 2, "mini_batch_size": 3, "max_tokens_per_micro_batch": 400},
            "trainer": {"device": "cpu"},
            "distributed": {"num_ranks": 2, "cpus_per_rank": 0.5, "timeout_s": 120},
        }
    )
    single = PolicyActor(
        load_causal_lm(cfg.model, str(saved.model), CPU),
        actor=cfg.actor,
        algorithm=cfg.algorithm,
        total_steps=10,
        mini_batch_rows=3,
        max_response_length=8,
        device=CPU,
    )
    group = RayActorGroup(cfg, total_steps=10, weights_path=str(saved.model), with_reference=False,
                          critic_path=str(saved.model))  # fmt: skip
    batch = TrajectoryBatch.from_trajectories(vision_trajectories(tok, noise_image), tok.pad_token_id)
    expected, _ = single.compute_logprobs(batch, temperature=1.0)
    got, _ = group.compute_logprobs(batch, temperature=1.0)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)

    batch["old_logprobs"] = expected - 0.05 * batch.loss_mask
    gen = torch.Generator().manual_seed(1)
    batch["advantages"] = torch.randn(batch.loss_mask.shape, generator=gen) * batch.loss_mask
    expected_metrics = single.update_policy(batch)
    got_metrics = group.update_policy(batch)
    for key, value in expected_metrics.items():
        assert got_metrics[key] == pytest.approx(value, rel=1e-4, abs=1e-5), key
    weights = group.named_weights()
    for name, value in single.model.state_dict().items():
        torch.testing.assert_close(weights[name], value, rtol=1e-4, atol=2e-5)
    assert any(not torch.equal(weights[n], v) for n, v in single.model.state_dict().items() if "visual" in n)

    # the critic on the same ranks: PPO's value update over image rows equals the in-process one
    assert group.critic is not None
    critic = ValueCritic(
        ValueModel.from_pretrained(cfg.model, str(saved.model)),
        critic=cfg.critic,
        loss_agg_mode=cfg.algorithm.policy_loss.agg_mode,
        total_steps=10,
        mini_batch_rows=cfg.critic.mini_batch_size,
        device=CPU,
    )
    batch["values"] = critic.compute_values(batch)
    batch["returns"] = torch.linspace(-1, 1, batch.loss_mask.numel()).reshape(batch.loss_mask.shape) * batch.loss_mask
    expected_metrics = critic.update_critic(batch)
    got_metrics = group.critic.update_critic(batch)
    for key, value in expected_metrics.items():
        assert got_metrics[key] == pytest.approx(value, rel=1e-4, abs=1e-5), key
    torch.testing.assert_close(group.critic.compute_values(batch), critic.compute_values(batch), rtol=1e-4, atol=1e-5)
    group.close()
