"""Recipe: GSM8K reasoning with SmolLM2-135M-Instruct on vLLM, one command (`python3 -m nox -s recipe-gsm8k`).

prepare-data -> warm-up on the rows' worked solutions -> `reasoning filter-rows` (offline difficulty filtering,
Skywork-OR1: the warmed-up model samples each training row --filter-samples times, and GRPO trains only on the rows
it solves sometimes; a row never solved gives a group of equal rewards, no gradient) -> `reasoning train --config
grpo --engine vllm` at --temperature -> `reasoning eval` on 100 held-out dev rows at three points (untrained,
warmed up, after RL), with a paired
bootstrap interval for RL minus its starting point (the warmed-up model). A row's accuracy is the mean over
--eval-samples samples at --eval-temperature (default 4 at 0.6, the eval's own default temperature): at the few
percent a 135M model reaches, one greedy answer per row (0 or 1) leaves the interval almost nothing to resolve;
`--eval-samples 1 --eval-temperature 0` gives the greedy figure. Data: apps/reasoning/recipes/gsm8k/
(400 train rows, 100 dev rows, disjoint; see SOURCE.md there). The defaults take about an hour on two idle
cores (docs/recipes.md); `--steps`, `--prompts`, `--warmup-epochs`, `--filter-samples` and `--max-tokens` shrink it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
import recipe_common
from recipe_common import ROOT, Chain, chain_parser, cpu_grpo_overrides, read_jsonl, tool

DATA = ROOT / "apps" / "reasoning" / "recipes" / "gsm8k"
__all__ = [
    "DATA",
    "eval_flags",
    "filter_flags",
    "main",
    "parse",
    "row_scores",
    "tool",
    "train_overrides",
    "warmup_command",
]


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = chain_parser(__doc__, "reasoning", "recipe-gsm8k", steps=16, lr=1e-5)
    p.add_argument("--warmup-epochs", type=float, default=1.0, help="supervised passes (default: %(default)s)")
    p.add_argument("--max-tokens", type=int, default=256, help="response tokens (default: %(default)s)")
    p.add_argument("--eval-samples", type=int, default=4, help="samples per dev row (default: %(default)s)")
    p.add_argument("--eval-temperature", type=float, default=0.6, help="0: greedy (default: %(default)s)")
    p.add_argument("--temperature", type=float, default=0.6, help="GRPO's and filter-rows' sampling temperature "
                   "(default: %(default)s, the eval's)")  # fmt: skip
    p.add_argument("--filter-samples", type=int, default=4, help="samples per training row in `reasoning filter-rows` "
                   "(0: train on every row; default: %(default)s)")  # fmt: skip
    args = p.parse_args(argv)
    if args.filter_samples == 1 or args.filter_samples < 0:
        p.error(f"--filter-samples {args.filter_samples}: give 0 (no filtering) or at least 2 (a pass rate in (0, 1))")
    if args.temperature <= 0:
        p.error(f"--temperature {args.temperature}: GRPO samples, give a temperature above 0 (e.g. 0.6)")
    return args


def train_overrides(args: argparse.Namespace, start: Path, run: Path) -> list[str]:
    """The CPU cut of the grpo config (recipe_common; it drops the KL term: the reference model's forward was 18 of
    a 110 s step here), with vLLM's context at 1,024 tokens and GRPO sampling at --temperature."""
    own = ["rollout.vllm.max_model_len=1024", f"rollout.temperature={args.temperature}"]
    return cpu_grpo_overrides(args, start, run, own)


def filter_flags(args: argparse.Namespace) -> list[Any]:
    """`reasoning filter-rows`' sampling: as GRPO's rollouts will sample (temperature, top-p 1, length)."""
    return ["--n", args.filter_samples, "--temperature", args.temperature, "--top-p", 1.0,
            "--max-tokens", args.max_tokens, "--score-workers", "1"]  # fmt: skip


def warmup_command(args: argparse.Namespace, rows: Path, out: Path) -> list[Any]:
    """`reasoning warmup`: supervised on the rows' worked solutions ending in `\\boxed{gold}`, as the reward reads."""
    return recipe_common.warmup_command(args, "reasoning", rows, out, ["--epochs", args.warmup_epochs])


def row_scores(folder: Path) -> list[float]:
    """Per-row accuracy in dev-row order: the mean score of the row's samples."""
    by_row: dict[int, list[float]] = {}
    for record in read_jsonl(folder / "samples_gsm8k.jsonl"):
        by_row.setdefault(int(record["problem"]), []).append(float(record["score"]))
    return [sum(scores) / len(scores) for _, scores in sorted(by_row.items())]


def eval_flags(args: argparse.Namespace) -> list[Any]:
    """`reasoning eval`'s sampling: --eval-samples at --eval-temperature, seeded, the recipe's response length."""
    if args.eval_samples < 1:
        raise SystemExit(f"--eval-samples must be at least 1, got {args.eval_samples}")
    return ["--temperature", args.eval_temperature, "--n", args.eval_samples, "--max-tokens", args.max_tokens,
            "--score-workers", "1"]  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    args = parse(sys.argv[1:] if argv is None else argv)
    chain = Chain(args, "reasoning", eval_flags(args), lambda folder: {"accuracy": row_scores(folder)})
    chain.prepare(DATA, ["--dataset", "gsm8k"])
    chain.measure("untrained", args.model)
    chain.measure("warmup", chain.warm_up(warmup_command(args, chain.train_rows, chain.warm)))
    rows = chain.filter_rows(chain.warm, filter_flags(args)) if args.filter_samples else chain.train_rows
    chain.measure("rl", chain.train(["--score-workers", "1", *train_overrides(args, chain.warm, chain.grpo)], rows))
    comparisons = {
        "rl - warmup (accuracy)": ("accuracy", "warmup", "rl"),
        "rl - untrained (accuracy)": ("accuracy", "untrained", "rl"),
        "warmup - untrained (accuracy)": ("accuracy", "untrained", "warmup"),
    }
    how = "greedy" if args.eval_temperature == 0 else f"avg@{args.eval_samples} at T {args.eval_temperature}"
    chain.report(f"GSM8K, SmolLM2-135M-Instruct, held-out accuracy ({how})", comparisons)


if __name__ == "__main__":
    main()
