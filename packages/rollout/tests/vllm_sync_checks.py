"""What the vLLM engine tests share (`tests/` is on sys.path, see conftest): the tiny model vLLM's CPU attention
can run, perturbed weights to sync into it, and the check that the engine's sampled-token log-probs are the ones
the trainer's forward computes on the same weights."""

from __future__ import annotations

from typing import Any

import torch

from rlloom.core_rl.contracts.generation import GenerationRequest, SamplingParams
from rlloom.core_rl.contracts.trajectory import Trajectory
from rlloom.core_rl.tiny import char_tokenizer, tiny_qwen2

SHAPE: dict[str, int] = {"hidden_size": 128, "num_heads": 2, "num_kv_heads": 1}  # head_dim 64 for CPU attention
PROMPTS = ["hello", "abc", "What is 2+3?"]


def ids(text: str) -> list[int]:
    return list(char_tokenizer()(text, add_special_tokens=False)["input_ids"])


def perturbed(seed: int, scale: float = 4.0) -> torch.nn.Module:
    """The base model's weights plus seeded noise, embeddings scaled so greedy choices have clear margins."""
    model = tiny_qwen2(char_tokenizer(), seed=0, **SHAPE)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() >= 2:
                param.add_(torch.randn(param.shape, generator=gen) * 0.02 * scale)
        model.model.embed_tokens.weight.mul_(scale)
    return model.eval()


def sampled_logprob_mismatch(engine: Any, model: torch.nn.Module) -> tuple[dict[str, torch.Tensor], list[Trajectory]]:
    """Sample 4 x 16 tokens per prompt at temperature 1 from `engine`, then score them with `model` as the trainer
    does: the mismatch metrics between the two log-probs, and the sampled trajectories."""
    from rlloom.core_rl.algorithms.mismatch import mismatch_metrics
    from rlloom.core_rl.contracts.batch import TrajectoryBatch
    from rlloom.core_rl.workers.forward import response_logprobs

    sampling = SamplingParams(n=4, seed=3, max_tokens=16, ignore_eos=True, logprobs=True)
    results = engine.generate([GenerationRequest(prompt_ids=ids(p), sampling=sampling) for p in PROMPTS])
    trajectories = [
        Trajectory(
            prompt_ids=c.prompt_ids,
            response_ids=c.token_ids,
            loss_mask=[1] * len(c.token_ids),
            rollout_logprobs=c.logprobs,
            group_id=str(i),
        )
        for i, samples in enumerate(results)
        for c in samples
    ]
    batch = TrajectoryBatch.from_trajectories(trajectories, pad_token_id=char_tokenizer().pad_token_id)
    with torch.no_grad():
        trainer, _ = response_logprobs(model, batch, temperature=1.0)
    return mismatch_metrics(trainer, batch["rollout_logprobs"], batch.loss_mask), trajectories
