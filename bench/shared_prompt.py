"""Actor update time with each prompt forwarded once per group (`actor.share_prompt_forward`) against the full
padded forward that runs every sample's prompt again (what veRL, TRL and OpenRLHF do).

GRPO samples G responses per prompt; the full forward computes the prompt's activations G times, forward and
backward. Sharing forwards each distinct prompt once, indexes its keys and values out to the G rows and runs the
responses against them: the same log-probs and gradients (checked here before timing) with fewer tokens. The
reference speed-up is the token ratio G (p + r) / (p + G r), less where attention or the LM head dominate.

Both rows are `PolicyActor`s from the same weights making the same single optimizer step (one epoch, one
mini-batch, old log-probs from the update) on the same batch, alternating; CPU-time medians.

Run: .venv/bin/python bench/shared_prompt.py [--repeats 5] [--threads 1] [--model models/smollm2-135m-instruct]
"""

from __future__ import annotations

import argparse
import copy
from pathlib import Path

import torch
from core_rl import make_actor, median_seconds
from transformers import AutoModelForCausalLM, PreTrainedModel

from rlloom.core_rl.contracts.batch import TrajectoryBatch
from rlloom.core_rl.contracts.trajectory import Trajectory
from rlloom.core_rl.tiny import char_tokenizer, tiny_qwen2
from rlloom.core_rl.workers.forward import response_logprobs

SHAPES = [  # (prompts, samples per prompt, prompt length, response length)
    (8, 4, 35, 64),  # bench/grpo_vllm_vs_trl.py's step: the reversal prompts on SmolLM2, 64 new tokens
    (4, 8, 256, 128),  # a longer prompt (few-shot math, retrieved passages), eight samples
    (16, 16, 128, 256),  # DAPO's group of 16, responses longer than the prompt
]


def grouped_batch(vocab: int, prompts: int, group: int, p_len: int, r_len: int) -> TrajectoryBatch:
    """`prompts` distinct prompts (ragged by up to 9 tokens) with `group` ragged responses each."""
    gen = torch.Generator().manual_seed(0)
    trajs = []
    for i in range(prompts):
        prompt = torch.randint(10, vocab, (p_len - (i % 4) * 3,), generator=gen).tolist()
        for j in range(group):
            response = torch.randint(10, vocab, (r_len - (j % 5) * 7,), generator=gen).tolist()
            trajs.append(Trajectory(prompt_ids=prompt, response_ids=response, loss_mask=[1] * len(response)))
    batch = TrajectoryBatch.from_trajectories(trajs, pad_token_id=3)
    batch["advantages"] = torch.randn(batch.loss_mask.shape, generator=gen) * batch.loss_mask
    return batch


def bench_shape(model: PreTrainedModel, vocab: int, shape: tuple[int, int, int, int], repeats: int) -> str:
    prompts, group, p_len, r_len = shape
    batch = grouped_batch(vocab, prompts, group, p_len, r_len)
    with torch.no_grad():  # the two paths agree before anything is timed
        full, _ = response_logprobs(model.eval(), batch)
        shared, _ = response_logprobs(model, batch, share_prompts=True)
    gap = float((full - shared).abs().max())
    assert gap < 1e-4, f"shared-prompt log-probs differ from the full forward's by {gap}"
    rows = batch.batch_size
    full_actor = make_actor(model, samples=rows, response_len=r_len, budget=10**9, share_prompts=False)
    shared_actor = make_actor(copy.deepcopy(model), samples=rows, response_len=r_len, budget=10**9)
    assert full_actor.single_update(rows)
    t_full, t_shared = median_seconds(
        [lambda: full_actor.update_policy(batch), lambda: shared_actor.update_policy(batch)], repeats
    )
    real = int(batch["attention_mask"].sum())
    p_mean = float(batch["attention_mask"][:, : batch.prompt_width].sum()) / rows
    r_mean = (real - p_mean * rows) / rows
    reference = group * (p_mean + r_mean) / (p_mean + group * r_mean)
    return (
        f"| {prompts} × {group} | {p_len} + {r_len} | {t_full * 1e3:.0f} | {t_shared * 1e3:.0f} | "
        f"**{t_full / t_shared:.2f}x** | {reference:.2f}x | {gap:.1e} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--model", type=Path, default=None, help="a transformers folder (default: a tiny Qwen2)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.model is None:
        tok = char_tokenizer()
        model: PreTrainedModel = tiny_qwen2(tok, hidden_size=256, num_layers=4, intermediate_size=512, seed=0)
        name, vocab = "tiny Qwen2 256 x 4", len(tok)
    else:
        model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
        name, vocab = args.model.name, int(model.config.vocab_size)
    print(f"{name}, fp32, {args.threads} torch thread(s), CPU-time medians of {args.repeats}")
    print(
        "| prompts × samples | prompt + response | full forward (ms) | shared prompt (ms) | speed-up | token ratio "
        "| max |Δ log-prob| |"
    )
    print("|---|---|---|---|---|---|---|")
    for shape in SHAPES:
        print(bench_shape(model, vocab, shape, args.repeats), flush=True)


if __name__ == "__main__":
    main()
