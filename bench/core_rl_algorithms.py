"""Benchmark rlloom.core_rl.algorithms against the straightforward implementations they replace.

Peers, measured in the same run on the same inputs:
- GRPO advantages: the per-sample Python loop of veRL's original `compute_grpo_outcome_advantage` (transcribed
  below: dict of lists per uid, torch.mean/torch.std per group) vs our vectorised `grpo_advantages`.
- token log-probs: `log_softmax(logits.float()).gather(ids)` (materialises [N, V] in float32) vs our chunked
  `logprobs_from_logits`, on bf16 logits as a training step has them. Time of the forward, of forward + backward
  (at 2,048 and 8,192 rows), and the peak extra resident memory of a fresh process (Linux /proc high-water mark),
  without and with backward.
- entropy: `torch.distributions.Categorical(logits=...).entropy()` vs our chunked `entropy_from_logits`.

Run: .venv/bin/python bench/core_rl_algorithms.py [--repeats 7]
Prints medians and ratios (peer / ours: > 1 means ours is faster or smaller).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable

import torch

from rlloom.core_rl.algorithms import entropy_from_logits, grpo_advantages, logprobs_from_logits

VOCAB, ROWS = 32_768, 4 * 512  # a 4 × 512-token micro-batch of a 32k-vocabulary model


def verl_loop_grpo(scores: torch.Tensor, index: list[str], eps: float = 1e-6) -> torch.Tensor:
    """veRL's original (pre-vectorisation) GRPO outcome advantage, transcribed for comparison."""
    scores = scores.clone()
    id2score: dict[str, list[torch.Tensor]] = defaultdict(list)
    id2mean, id2std = {}, {}
    for i in range(scores.shape[0]):
        id2score[index[i]].append(scores[i])
    for idx, group in id2score.items():
        if len(group) == 1:
            id2mean[idx], id2std[idx] = torch.tensor(0.0), torch.tensor(1.0)
        else:
            stacked = torch.stack(group)
            id2mean[idx], id2std[idx] = torch.mean(stacked), torch.std(stacked)
    for i in range(scores.shape[0]):
        scores[i] = (scores[i] - id2mean[index[i]]) / (id2std[index[i]] + eps)
    return scores


def median_seconds(fn: Callable[[], object], repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def peak_rss_mib(variant: str) -> float:
    """Peak extra resident memory (MiB) of a fresh interpreter running one variant once on existing inputs."""
    out = subprocess.run(
        [sys.executable, __file__, "--peak-memory", variant], capture_output=True, text=True, check=True
    ).stdout
    return float(out.strip().splitlines()[-1])


def _proc_status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        lines = f.read().splitlines()
    for line in lines:
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def _child_peak(variant: str) -> None:
    """Linux: reset the high-water mark (clear_refs 5) once the inputs exist, run, read VmHWM − VmRSS before."""
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(ROWS, VOCAB, generator=gen).bfloat16()
    ids = torch.randint(0, VOCAB, (ROWS,), generator=gen)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    before = _proc_status_kib("VmRSS")
    if variant.endswith("-grad"):
        logits.requires_grad_(True)
    if variant.startswith("naive"):
        out = torch.log_softmax(logits.float(), -1).gather(-1, ids[:, None])
    elif variant.startswith("ours"):
        out = logprobs_from_logits(logits, ids)
    else:
        raise ValueError(variant)
    if variant.endswith("-grad"):
        out.sum().backward()
    print((_proc_status_kib("VmHWM") - before) / 1024)


def _naive_backward(logits: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> None:
    leaf = logits.detach().requires_grad_(True)
    out = torch.log_softmax(leaf.float(), -1).gather(-1, ids[:, None]).squeeze(-1)
    (out * weights).sum().backward()


def _ours_backward(logits: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> None:
    leaf = logits.detach().requires_grad_(True)
    (logprobs_from_logits(leaf, ids) * weights).sum().backward()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--peak-memory", choices=["naive", "ours", "naive-grad", "ours-grad"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.peak_memory:
        _child_peak(args.peak_memory)
        return
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    rows: list[tuple[str, float, float]] = []

    scores = torch.randint(0, 2, (4096,), generator=gen).float()
    uids = [f"prompt-{i // 8}" for i in range(4096)]  # 512 prompts × 8 responses
    torch.testing.assert_close(grpo_advantages(scores, uids), verl_loop_grpo(scores, uids))
    rows.append(
        (
            "GRPO advantages, 512 groups × 8",
            median_seconds(lambda: verl_loop_grpo(scores, uids), args.repeats),
            median_seconds(lambda: grpo_advantages(scores, uids), args.repeats),
        )
    )

    logits = torch.randn(ROWS, VOCAB, generator=gen).bfloat16()
    ids = torch.randint(0, VOCAB, (ROWS,), generator=gen)
    torch.testing.assert_close(
        logprobs_from_logits(logits, ids), torch.log_softmax(logits.float(), -1).gather(-1, ids[:, None]).squeeze(-1)
    )
    rows.append(
        (
            f"token log-probs, {ROWS} × {VOCAB} bf16",
            median_seconds(lambda: torch.log_softmax(logits.float(), -1).gather(-1, ids[:, None]), args.repeats),
            median_seconds(lambda: logprobs_from_logits(logits, ids), args.repeats),
        )
    )
    for n_rows in (ROWS, 4 * ROWS):  # 4x the rows: a chunk loop whose backward is quadratic in rows shows here
        big = torch.randn(n_rows, VOCAB, generator=gen).bfloat16()
        big_ids = torch.randint(0, VOCAB, (n_rows,), generator=gen)
        weights = torch.rand(n_rows, generator=gen)
        rows.append(
            (
                f"token log-probs + backward, {n_rows} × {VOCAB}",
                median_seconds(lambda b=big, i=big_ids, w=weights: _naive_backward(b, i, w), args.repeats),
                median_seconds(lambda b=big, i=big_ids, w=weights: _ours_backward(b, i, w), args.repeats),
            )
        )
    rows.append(
        (
            f"entropy, {ROWS} × {VOCAB} bf16",
            median_seconds(lambda: torch.distributions.Categorical(logits=logits.float()).entropy(), args.repeats),
            median_seconds(lambda: entropy_from_logits(logits), args.repeats),
        )
    )

    print(f"{'case':<40} {'peer (ms)':>10} {'ours (ms)':>10} {'peer/ours':>10}")
    for name, peer, ours in rows:
        print(f"{name:<40} {peer * 1e3:>10.2f} {ours * 1e3:>10.2f} {peer / ours:>10.2f}")
    print("\npeak extra resident memory, token log-probs (fresh process):")
    for mode in ("", "-grad"):
        naive, ours_mem = peak_rss_mib("naive" + mode), peak_rss_mib("ours" + mode)
        label = "forward + backward" if mode else "forward (no grad)"
        print(
            f"  {label:<20} log_softmax+gather {naive:>6.0f} MiB   ours {ours_mem:>6.0f} MiB   "
            f"ratio {naive / max(ours_mem, 1.0):.1f}x"
        )


if __name__ == "__main__":
    main()
