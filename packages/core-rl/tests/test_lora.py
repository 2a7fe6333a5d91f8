"""LoRA actor (peft): the reference is the adapter-disabled base, the engine receives merged weights, and
checkpoints hold a loadable merged model plus the adapter to resume from."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from tiny_run import SamplingEngine, digit_reward, sum_rows, tiny_config
from transformers import AutoModelForCausalLM

from rlloom.core_rl.contracts.batch import TrajectoryBatch
from rlloom.core_rl.contracts.trajectory import Trajectory
from rlloom.core_rl.trainer import Trainer
from rlloom.core_rl.workers.actor import ADAPTER_DIR

pytest.importorskip("peft")

LORA = ["model.lora_rank=4", "model.lora_alpha=8", "actor.lr=1e-2", "algorithm.kl.use_loss=true"]


def make_trainer(model_dir: Path, out: Path, steps: int) -> tuple[Trainer, SamplingEngine]:
    engine = SamplingEngine(model_dir)
    trainer = Trainer(
        tiny_config(model_dir, out, [*LORA, f"trainer.total_steps={steps}", "trainer.save_every=1"]),
        engine=engine,
        reward_fn=digit_reward,
        train_data=sum_rows(8),
    )
    return trainer, engine


def test_lora_reference_is_the_base_and_checkpoints_resume(tiny_model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "lora"
    trainer, engine = make_trainer(tiny_model_dir, out, steps=2)
    trainer.fit()
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    trajs = [Trajectory(prompt_ids=[5, 6, 7], response_ids=[8, 9, 10, 11], loss_mask=[1, 1, 1, 1])]
    batch = TrajectoryBatch.from_trajectories(trajs, pad_token_id=3)
    assert trainer.parts.reference is not None
    ref, _ = trainer.parts.reference.compute_logprobs(batch, temperature=1.0)
    with torch.no_grad():
        logits = base(input_ids=batch["input_ids"]).logits[0, 2:-1]
    expected = torch.log_softmax(logits, -1).gather(-1, batch.responses[0, :, None]).squeeze(-1)
    torch.testing.assert_close(ref[0], expected, rtol=1e-5, atol=1e-5)
    # the trained policy differs from the base, and the engine holds exactly the merged policy weights
    policy, _ = trainer.parts.actor.compute_logprobs(batch, temperature=1.0)
    assert not torch.allclose(policy, ref)
    merged = trainer.parts.actor.named_weights()
    assert set(merged) == set(engine.model.state_dict())
    assert all(torch.equal(engine.model.state_dict()[k], v) for k, v in merged.items())

    step2 = out / "checkpoints" / "step_2"
    assert (step2 / ADAPTER_DIR / "adapter_config.json").exists()
    reloaded = AutoModelForCausalLM.from_pretrained(step2).eval()
    with torch.no_grad():
        reloaded_logits = reloaded(input_ids=batch["input_ids"]).logits[0, 2:-1]
    reloaded_lp = torch.log_softmax(reloaded_logits, -1).gather(-1, batch.responses[0, :, None]).squeeze(-1)
    torch.testing.assert_close(reloaded_lp, policy[0], rtol=1e-4, atol=1e-5)

    # resume from the adapter and keep going
    resumed, _ = make_trainer(tiny_model_dir, out, steps=3)
    assert resumed.step == 2
    resumed.fit()
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_merged_weights_leave_the_frozen_base_untouched(tiny_model_dir: Path, dtype: str) -> None:
    """Weight syncs send base + LoRA delta without merging into the model: W + BA - BA is not W in floating point,
    so merge-then-unmerge nudged the frozen base (and the LoRA reference) at every step."""
    import copy

    from rlloom.core_rl.config.schema import ModelConfig
    from rlloom.core_rl.workers.actor import _merged_lora_weights, load_causal_lm

    config = ModelConfig(path=str(tiny_model_dir), lora_rank=4, lora_alpha=8, dtype=dtype)
    model = load_causal_lm(config, str(tiny_model_dir), torch.device("cpu"))
    generator = torch.Generator().manual_seed(0)
    for name, param in model.named_parameters():
        if "lora_B" in name:  # peft starts B at zero, which would make every delta vanish
            param.data.copy_(torch.randn(param.shape, generator=generator) * 0.1)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    for _ in range(10):
        merged = _merged_lora_weights(model)
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # bitwise: nothing in the model moved
    reference = copy.deepcopy(model).merge_and_unload().state_dict()  # peft's own merge, on a copy
    assert merged.keys() == reference.keys()
    for key, value in reference.items():
        assert torch.equal(merged[key], value), key
