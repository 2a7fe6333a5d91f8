"""Overhead of rlloom's PPO update over the same computation written as a bare torch loop (the floor).

One PPO update = forward over a fixed batch, response log-probs, clipped surrogate (token-mean), backward,
grad-norm clipping, AdamW step. Ours goes through `PolicyActor.update_policy` (TrajectoryBatch, token-budget
micro-batching, global-count loss normalisation, registry-selected loss, metrics); the floor is the dozen lines
in `bare_update` below. Both start from the same weights and see the same batch; runs alternate (ours, floor,
ours, ...) so load on a shared machine hits both alike. A second "ours" row splits the batch into 4 token-budget
micro-batches with gradient accumulation, which the floor does not do (extra work, reported for information).
The last row has Qwen2.5's 151,936-token vocabulary and prompts longer than responses, as multi-turn and RAG
prompts are: there the floor's full-width logits (what one writes inline) cost more than ours, which runs the LM
head only on the positions that score a response token (`logits_to_keep`).

Run: .venv/bin/python bench/core_rl.py [--repeats 9] [--threads 1]
Prints CPU-time medians and the overhead ratio ours/floor − 1 (goal: ≤ 10%).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
from transformers import PreTrainedModel

from rlloom.core_rl.config.schema import ActorConfig, AlgorithmConfig
from rlloom.core_rl.contracts.batch import TrajectoryBatch
from rlloom.core_rl.contracts.trajectory import Trajectory
from rlloom.core_rl.tiny import char_tokenizer, tiny_qwen2
from rlloom.core_rl.workers.actor import PolicyActor

CPU = torch.device("cpu")
SIZES = [  # (hidden, layers, samples, prompt length, response length, vocabulary; 0: the char tokenizer's)
    (64, 2, 16, 32, 64, 0),
    (128, 2, 16, 64, 128, 0),
    (256, 4, 8, 64, 192, 0),
    (256, 4, 8, 256, 64, 151_936),
]


def make_batch(vocab: int, samples: int, prompt_len: int, response_len: int) -> TrajectoryBatch:
    gen = torch.Generator().manual_seed(0)
    trajs = []
    for i in range(samples):
        p = prompt_len - (i % 4) * 3  # ragged prompts and responses, as rollouts are
        r = response_len - (i % 5) * 7
        ids = torch.randint(10, vocab, (p + r,), generator=gen).tolist()
        trajs.append(Trajectory(prompt_ids=ids[:p], response_ids=ids[p:], loss_mask=[1] * r, group_id=str(i // 4)))
    batch = TrajectoryBatch.from_trajectories(trajs, pad_token_id=3)
    batch["advantages"] = torch.randn(batch.loss_mask.shape, generator=gen) * batch.loss_mask
    return batch


def bare_update(model: PreTrainedModel, opt: torch.optim.Optimizer, batch: TrajectoryBatch) -> float:
    """The floor: what a researcher would write inline for one PPO step."""
    width_p = batch.prompt_width
    logits = model(
        input_ids=batch["input_ids"],
        attention_mask=batch["attention_mask"],
        position_ids=batch["position_ids"],
        use_cache=False,
    ).logits[:, width_p - 1 : -1]
    logprobs = torch.log_softmax(logits.float(), -1).gather(-1, batch.responses.unsqueeze(-1)).squeeze(-1)
    ratio = torch.exp(logprobs - batch["old_logprobs"])
    adv, mask = batch["advantages"], batch.loss_mask
    loss = torch.maximum(-adv * ratio, -adv * ratio.clamp(0.8, 1.2))
    loss = (loss * mask).sum() / mask.sum()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return float(loss.detach())


def median_seconds(runs: list[Callable[[], object]], repeats: int) -> list[float]:
    """Median CPU seconds of each callable, alternating them so drift affects all alike.

    CPU time of this process (one torch thread) rather than wall time: on a shared machine the wall clock also
    counts the time other processes hold the cores, which swamps a 10% difference.
    """
    for fn in runs:
        fn()  # warm-up
    times: list[list[float]] = [[] for _ in runs]
    for _ in range(repeats):
        for i, fn in enumerate(runs):
            start = time.process_time()
            fn()
            times[i].append(time.process_time() - start)
    return [statistics.median(t) for t in times]


def make_actor(
    model: PreTrainedModel, *, samples: int, response_len: int, budget: int, share_prompts: bool = True
) -> PolicyActor:
    return PolicyActor(
        model,
        actor=ActorConfig(
            lr=1e-5,
            ppo_epochs=1,
            mini_batch_size=samples,
            shuffle=False,
            max_tokens_per_micro_batch=budget,
            grad_clip=1.0,
            share_prompt_forward=share_prompts,
        ),
        algorithm=AlgorithmConfig(policy_loss={"clip_low": 0.2, "clip_high": 0.2, "agg_mode": "token-mean"}),
        total_steps=10**6,
        mini_batch_rows=samples,
        max_response_length=response_len,
        device=CPU,
    )


def bench_size(size: tuple[int, int, int, int, int, int], repeats: int) -> str:
    """One table row: floor vs ours (one micro-batch) vs ours (4 micro-batches)."""
    hidden, layers, samples, p_len, r_len, vocab = size
    tok = char_tokenizer()
    models = [
        tiny_qwen2(tok, hidden_size=hidden, num_layers=layers, intermediate_size=2 * hidden, seed=0) for _ in range(3)
    ]
    if vocab:
        for seed, m in enumerate(models):
            torch.manual_seed(seed)
            m.resize_token_embeddings(vocab, mean_resizing=False)
        for m in models[1:]:
            m.load_state_dict(models[0].state_dict())
    batch = make_batch(vocab or len(tok), samples, p_len, r_len)
    with torch.no_grad():
        logits = models[0](
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False
        ).logits[:, batch.prompt_width - 1 : -1]
        old = torch.log_softmax(logits, -1).gather(-1, batch.responses.unsqueeze(-1)).squeeze(-1)
    batch["old_logprobs"] = old * batch.loss_mask
    real_tokens = int(batch["attention_mask"].sum())
    padded_tokens = batch["input_ids"].numel()
    ours = make_actor(models[0], samples=samples, response_len=r_len, budget=10**9)
    ours_micro = make_actor(models[1], samples=samples, response_len=r_len, budget=padded_tokens // 4 + 1)
    floor_opt = torch.optim.AdamW(models[2].parameters(), lr=1e-5, weight_decay=0.01, foreach=True)
    for m in models:
        m.train()
    t_ours, t_floor, t_micro = median_seconds(
        [
            lambda: ours.update_policy(batch),
            lambda: bare_update(models[2], floor_opt, batch),
            lambda: ours_micro.update_policy(batch),
        ],
        repeats,
    )
    return (
        f"| {hidden} × {layers}{f', vocab {vocab:,}' if vocab else ''} | {samples} × {padded_tokens // samples} "
        f"({real_tokens} real) | "
        f"{t_floor * 1e3:.1f} | {t_ours * 1e3:.1f} | {100 * (t_ours / t_floor - 1):+.1f}% | {t_micro * 1e3:.1f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rows", type=int, nargs="*", default=None, help="table rows to run (0-based; default all)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} thread(s), CPU-time medians of {args.repeats}\n")
    print(
        "| model (hidden × layers) | batch (samples × padded tokens) | floor (ms) | ours (ms) | overhead "
        "| ours, 4 micro-batches (ms) |"
    )
    print("|---|---|---|---|---|---|")
    for i, size in enumerate(SIZES):
        if args.rows is None or i in args.rows:
            print(bench_size(size, args.repeats), flush=True)


if __name__ == "__main__":
    main()
