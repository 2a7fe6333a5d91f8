"""A real, small rollout engine and rule reward for core-rl's tests, and a script entry for subprocess runs.

`SamplingEngine` implements `RolloutEngine` with Hugging Face `generate` on its own copy of the model (so weight
sync is exercised for real) and returns the sampling log-probs from the raw logits. `digit_reward` is a toy rule:
exact match with the sum in the prompt, plus partial credit for answering in digits. Run as a script:
`python tiny_run.py MODEL_DIR OUTPUT_DIR [key=value ...]` trains with data/tiny_grpo.yaml.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, PreTrainedTokenizerBase

from rlloom.core_rl.config.loading import load_config
from rlloom.core_rl.config.schema import RLConfig
from rlloom.core_rl.contracts.generation import Completion, GenerationRequest
from rlloom.core_rl.contracts.prompts import render_prompt
from rlloom.core_rl.contracts.protocols import RewardOutput
from rlloom.core_rl.contracts.trajectory import Trajectory
from rlloom.core_rl.tiny import char_tokenizer, tiny_qwen2
from rlloom.core_rl.workers.tokenizer_loading import load_pretrained_tokenizer

CONFIG = Path(__file__).parent / "data" / "tiny_grpo.yaml"


class SamplingEngine:
    """`model.generate` over left-padded prompts, n samples each, with per-token sampling log-probs."""

    def __init__(self, model_dir: str | Path) -> None:
        self.tokenizer: PreTrainedTokenizerBase = load_pretrained_tokenizer(model_dir)
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        self.weight_updates = 0

    def _prompt_ids(self, request: GenerationRequest) -> list[int]:
        return render_prompt(self.tokenizer, request)  # as every engine renders it

    def generate(self, requests: Sequence[GenerationRequest]) -> list[list[Completion]]:
        if not requests:
            return []
        params = requests[0].sampling
        prompts = [self._prompt_ids(r) for r in requests]
        rows = [(i, k) for i, r in enumerate(requests) for k in range(r.sampling.n)]
        width = max(len(p) for p in prompts)
        pad = int(self.tokenizer.pad_token_id)
        input_ids = torch.tensor([[pad] * (width - len(prompts[i])) + prompts[i] for i, _ in rows])
        attention = torch.tensor([[0] * (width - len(prompts[i])) + [1] * len(prompts[i]) for i, _ in rows])
        greedy = params.temperature == 0.0
        with torch.no_grad():
            out = self.model.generate(
                input_ids=input_ids,
                attention_mask=attention,
                do_sample=not greedy,
                temperature=None if greedy else params.temperature,
                top_p=None if greedy else params.top_p,
                top_k=None if greedy else params.top_k,
                max_new_tokens=params.max_tokens,
                output_logits=True,
                return_dict_in_generate=True,
                pad_token_id=pad,
                eos_token_id=self.tokenizer.eos_token_id,
            )
        new_tokens = out.sequences[:, width:]
        logits = torch.stack(out.logits, dim=1).float() / (1.0 if greedy else params.temperature)
        logprobs = torch.log_softmax(logits, -1).gather(-1, new_tokens.unsqueeze(-1)).squeeze(-1)
        results: list[list[Completion]] = [[] for _ in requests]
        for row, (i, k) in enumerate(rows):
            tokens = new_tokens[row].tolist()
            eos = self.tokenizer.eos_token_id
            length = tokens.index(eos) + 1 if eos in tokens else len(tokens)
            results[i].append(
                Completion(
                    request_id=requests[i].request_id,
                    prompt_ids=prompts[i],
                    token_ids=tokens[:length],
                    text=self.tokenizer.decode(tokens[:length], skip_special_tokens=True),
                    finish_reason="stop" if eos in tokens[:length] else "length",
                    logprobs=logprobs[row, :length].tolist(),
                    sample_index=k,
                )
            )
        return results

    async def agenerate(self, request: GenerationRequest) -> list[Completion]:
        return (await asyncio.to_thread(self.generate, [request]))[0]

    def update_weights(self, named_tensors: Mapping[str, torch.Tensor]) -> None:
        """Load all or a bucket of the weights; a name the model lacks is an error."""
        result = self.model.load_state_dict(dict(named_tensors), strict=False)
        if result.unexpected_keys:
            raise KeyError(f"update_weights: unknown tensors {result.unexpected_keys[:3]}")
        self.weight_updates += 1


def digit_reward(trajectories: Sequence[Trajectory]) -> list[RewardOutput]:
    """1 for the exact sum, plus half the fraction of digit characters (so random models see some signal)."""
    outputs = []
    for traj in trajectories:
        text = traj.response_text.strip()
        exact = float(text == str(traj.ground_truth))
        digits = sum(c.isdigit() for c in text) / len(text) if text else 0.0
        outputs.append(RewardOutput(score=exact + 0.5 * digits, components={"exact": exact, "digits": digits}))
    return outputs


def sum_rows(count: int, seed: int = 0) -> list[dict[str, Any]]:
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(count):
        a, b = torch.randint(0, 10, (2,), generator=gen).tolist()
        rows.append(
            {
                "prompt": [{"role": "user", "content": f"{a}+{b}="}],
                "data_source": "toy_sum",
                "reward_model": {"ground_truth": str(a + b)},
            }
        )
    return rows


def make_model_dir(path: str | Path) -> Path:
    """Save the tiny Qwen2 and its character tokenizer as an HF model directory."""
    path = Path(path)
    tokenizer = char_tokenizer()
    tiny_qwen2(tokenizer).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def tiny_config(model_dir: str | Path, output_dir: str | Path, overrides: Sequence[str] = ()) -> RLConfig:
    return load_config(CONFIG, [f"model.path={model_dir}", f"trainer.output_dir={output_dir}", *overrides])


def run(model_dir: str | Path, output_dir: str | Path, overrides: Sequence[str] = ()) -> dict[str, float]:
    from rlloom.core_rl.trainer import train

    config = tiny_config(model_dir, output_dir, overrides)
    return train(
        config,
        engine=SamplingEngine(model_dir),
        reward_fn=digit_reward,
        train_data=sum_rows(8),
        val_data=sum_rows(4, seed=1),
    )


if __name__ == "__main__":
    run(sys.argv[1], sys.argv[2], sys.argv[3:])
