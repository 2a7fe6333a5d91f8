"""Training-step time, synchronous vs one-step off-policy (`trainer.one_step_off_policy`), same run otherwise.

Synchronous RL alternates: generate the batch, then update on it, while the other side waits. veRL's
`one_step_off_policy` recipe generates the next batch during the update (one step of policy lag), so a step costs
about max(generation, update) instead of their sum. Both rows train the same tiny Qwen2 (hidden 128, 2 layers)
for the same steps from the same seed, with `HFEngine` on its own copy of the weights (synced every step) and a
rule reward. Each is timed at one and at two torch intra-op threads: at one thread the synchronous run keeps one
core busy and the off-policy run two (one per phase); at two threads the synchronous run gives both cores to
whichever phase runs, and the off-policy run's two phases share them.

Run: .venv/bin/python bench/off_policy.py [--steps 6] [--repeats 3]
Prints wall-clock medians per run (this measures overlap, so CPU time would hide it) and the speed-up over the
faster synchronous row. On a GPU cluster the recipe puts generation and training on different GPUs, so the
one-thread comparison (each phase with its own core) is the one that carries over.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))  # bench/ is not a package
from _rl_runs import save_tiny_model, timed_fit


def run(model_dir: Path, out: Path, *, steps: int, off_policy: bool, threads: int) -> tuple[float, dict[str, float]]:
    torch.set_num_threads(threads)
    overrides = [
        f"trainer.one_step_off_policy={str(off_policy).lower()}",
        "trainer.seed=0",
        "rollout.n=8",
        "rollout.max_tokens=48",
        "actor.mini_batch_size=4",
        "actor.ppo_epochs=2",
    ]
    return timed_fit(model_dir, out, overrides, steps=steps, rows=64)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = save_tiny_model(Path(tmp) / "model")
        variants = {
            "sync, 1 thread": (False, 1),
            "sync, 2 threads": (False, 2),
            "one-step off-policy, 1 thread": (True, 1),
            "one-step off-policy, 2 threads": (True, 2),
        }
        walls: dict[str, list[float]] = {name: [] for name in variants}
        last: dict[str, dict[str, float]] = {}
        for repeat in range(args.repeats + 1):  # the first round warms up and is not counted
            for name, (off_policy, threads) in variants.items():
                out = Path(tmp) / f"run_{repeat}_{len(walls[name])}_{off_policy}_{threads}"
                wall, metrics = run(model_dir, out, steps=args.steps, off_policy=off_policy, threads=threads)
                if repeat:
                    walls[name].append(wall)
                last[name] = metrics
    medians = {name: statistics.median(w) for name, w in walls.items()}
    best_sync = min(medians["sync, 1 thread"], medians["sync, 2 threads"])
    print(f"\n{args.steps} GRPO steps (8 prompts x 8 samples, 48 new tokens, 2 PPO epochs), median of {args.repeats}:")
    print("| run | wall s | s / step | speed-up vs the faster sync row | last step: rollout s / update s |")
    print("|---|---|---|---|---|")
    for name, median in medians.items():
        m = last[name]
        rollout = m.get("timing/rollout_s", m.get("timing/background_rollout_s", 0.0))
        print(
            f"| {name} | {median:.2f} | {median / args.steps:.2f} | {best_sync / median:.2f}x | "
            f"{rollout:.2f} / {m.get('timing/update_actor_s', 0.0):.2f} |"
        )
    lag = last["one-step off-policy, 1 thread"].get("rollout/policy_lag")
    print(f"policy lag of the off-policy run's last batch: {lag} step(s)")


if __name__ == "__main__":
    main()
