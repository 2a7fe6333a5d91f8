"""Actor time per training step when the step makes one optimizer step: old log-probs recomputed vs reused.

veRL runs a separate no-grad forward for the old log-probs every step (`compute_log_prob`), then the update's own
forward and backward. When the batch gets exactly one optimizer step (one epoch, one mini-batch: Dr. GRPO's and
many GRPO configs' setting), the weights cannot move in between, so the update's log-probs, detached, are the
same numbers (TRL's GRPOTrainer skips the forward there). rlloom does that under `algorithm.old_logprobs=auto`;
`recompute` is veRL's order. Both rows use `PolicyActor` from the same weights on the same batch, alternating.

Run: .venv/bin/python bench/old_logprobs.py [--repeats 7] [--threads 1]
Prints CPU-time medians and the speed-up recompute / auto (reference: (F + F + B) / (F + B), about 1.3x when a
backward costs two forwards).
"""

from __future__ import annotations

import argparse

import torch
from core_rl import make_actor, make_batch, median_seconds

from rlloom.core_rl.tiny import char_tokenizer, tiny_qwen2

SIZES = [  # (hidden, layers, samples, prompt length, response length)
    (128, 2, 16, 64, 128),
    (256, 4, 16, 128, 256),
]


def bench_size(size: tuple[int, int, int, int, int], repeats: int) -> str:
    hidden, layers, samples, p_len, r_len = size
    tok = char_tokenizer()
    models = [
        tiny_qwen2(tok, hidden_size=hidden, num_layers=layers, intermediate_size=2 * hidden, seed=0) for _ in range(2)
    ]
    batch = make_batch(len(tok), samples, p_len, r_len)
    assert "old_logprobs" not in batch.tensors
    recompute = make_actor(models[0], samples=samples, response_len=r_len, budget=10**9)
    reuse = make_actor(models[1], samples=samples, response_len=r_len, budget=10**9)
    assert reuse.single_update(batch.batch_size)

    def recompute_step() -> None:
        step = batch.select(list(range(batch.batch_size)))
        step["old_logprobs"], _ = recompute.compute_logprobs(step, temperature=1.0, entropy=True)
        recompute.update_policy(step)

    def reuse_step() -> None:
        reuse.update_policy(batch)

    t_recompute, t_reuse = median_seconds([recompute_step, reuse_step], repeats)
    tokens = int(batch["attention_mask"].sum())
    return (
        f"| {hidden} × {layers} | {samples} × {p_len}+{r_len} ({tokens} real tokens) | {t_recompute * 1e3:.0f} | "
        f"{t_reuse * 1e3:.0f} | **{t_recompute / t_reuse:.2f}x** |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} thread(s), CPU-time medians of {args.repeats}\n")
    print("| model (hidden × layers) | batch | recompute, veRL's order (ms) | auto (ms) | speed-up |")
    print("|---|---|---|---|---|")
    for size in SIZES:
        print(bench_size(size, args.repeats), flush=True)


if __name__ == "__main__":
    main()
