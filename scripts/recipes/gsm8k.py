"""Recipe: GSM8K reasoning with SmolLM2-135M-Instruct on vLLM, one command (`python3 -m nox -s recipe-gsm8k`).

prepare-data -> warm-up on the rows' worked solutions -> `reasoning train --config grpo --engine vllm` -> greedy
`reasoning eval` on 100 held-out dev rows at three points (untrained, warmed up, after RL), with a paired
bootstrap interval for RL minus its starting point (the warmed-up model). Data: apps/reasoning/recipes/gsm8k/
(400 train rows, 100 dev rows, disjoint; see SOURCE.md there). The defaults aim at about an hour on two idle
cores (not timed on one: docs/recipes.md); `--steps`, `--prompts`, `--warmup-epochs` and `--max-tokens` shrink it.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from recipe_common import Runner, read_jsonl, tool, write_report

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "apps" / "reasoning" / "recipes" / "gsm8k"
MODEL = ROOT / "models" / "smollm2-135m-instruct"


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, default=MODEL, help="instruct model folder (default: %(default)s)")
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "recipe-gsm8k", help="run folder (default: %(default)s)")
    p.add_argument("--train-rows", type=int, default=400, help="training rows used (default: %(default)s)")
    p.add_argument("--dev-rows", type=int, default=100, help="held-out rows measured (default: %(default)s)")
    p.add_argument("--warmup-epochs", type=float, default=1.0, help="supervised passes (default: %(default)s)")
    p.add_argument("--warmup-lr", type=float, default=1e-5, help="supervised learning rate (default: %(default)s)")
    p.add_argument("--steps", type=int, default=40, help="GRPO steps (default: %(default)s)")
    p.add_argument("--prompts", type=int, default=8, help="prompts per GRPO step (default: %(default)s)")
    p.add_argument("--n", type=int, default=4, help="samples per prompt (default: %(default)s)")
    p.add_argument("--lr", type=float, default=1e-5, help="GRPO learning rate (default: %(default)s)")
    p.add_argument("--max-tokens", type=int, default=256, help="response tokens (default: %(default)s)")
    p.add_argument("--engine", default="vllm", choices=["vllm", "hf"], help="rollout/eval engine (default: vllm)")
    p.add_argument("--tokenizer", type=Path, default=None, help="tokenizer folder when not in --model")
    p.add_argument("overrides", nargs="*", help="extra `reasoning train` overrides, e.g. actor.lr=5e-6")
    return p.parse_args(argv)


def train_overrides(args: argparse.Namespace, start: Path, run: Path) -> list[str]:
    """The grpo config cut to a CPU: one optimizer step per GRPO step, float32, eager vLLM, no in-run validation."""
    out = [
        f"model.path={start}",
        "model.dtype=float32",
        "model.gradient_checkpointing=false",
        f"data.train_batch_size={args.prompts}",
        f"rollout.n={args.n}",
        f"rollout.max_tokens={args.max_tokens}",
        "rollout.vllm.enforce_eager=true",
        "rollout.vllm.max_model_len=1024",
        "rollout.vllm.cpu_kvcache_space_gib=1",
        f"actor.mini_batch_size={args.prompts}",
        f"actor.lr={args.lr}",
        "actor.warmup_steps=0",
        f"trainer.total_steps={args.steps}",
        f"trainer.save_every={args.steps}",
        "trainer.val_every=0",
        "trainer.val_before_train=false",
        "trainer.device=cpu",
        "trainer.trackers=[console,jsonl]",
        f"trainer.output_dir={run}",
    ]
    if args.tokenizer is not None:
        out.append(f"model.tokenizer_path={args.tokenizer}")
    return [*out, *args.overrides]


def warmup_command(args: argparse.Namespace, rows: Path, out: Path) -> list[str]:
    """`reasoning warmup`: supervised on the rows' worked solutions ending in `\\boxed{gold}`, as the reward reads."""
    extra = ["--tokenizer", args.tokenizer] if args.tokenizer is not None else []
    return [tool("reasoning"), "warmup", "--model", args.model, *extra, "--train-data", rows, "--out", out,
            "--epochs", args.warmup_epochs, "--lr", args.warmup_lr]  # fmt: skip


def eval_command(args: argparse.Namespace, model: Path, rows: Path, out: Path, tokenizer: Path | None) -> list[str]:
    extra = ["--tokenizer", tokenizer] if tokenizer is not None else []
    return [
        tool("reasoning"), "eval", "--model", model, *extra, "--engine", args.engine, "--data", rows,
        "--temperature", "0", "--n", "1", "--max-tokens", args.max_tokens, "--score-workers", "1", "--out", out,
        *(["--device", "cpu"] if args.engine == "hf" else []),
    ]  # fmt: skip


def row_scores(folder: Path) -> list[float]:
    """Per-row accuracy in dev-row order (greedy, one sample a row)."""
    records = sorted(read_jsonl(folder / "samples_gsm8k.jsonl"), key=lambda r: r["problem"])
    return [float(r["score"]) for r in records]


def main(argv: list[str] | None = None) -> None:
    args = parse(sys.argv[1:] if argv is None else argv)
    if not (args.model / "config.json").exists():
        raise SystemExit(f"--model {args.model}: no config.json there; write SmolLM2 with `python3 -m nox -s smollm2`")
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    run = Runner(out / "commands.log")
    reasoning = tool("reasoning")
    train_rows, dev_rows = out / "rows" / "train.jsonl", out / "rows" / "dev.jsonl"
    for rows, src, limit in ((train_rows, "train", args.train_rows), (dev_rows, "dev", args.dev_rows)):
        run(f"prepare-data {src}", [reasoning, "prepare-data", "--dataset", "gsm8k", "--input", DATA / f"{src}.jsonl",
                                    "--out", rows, "--split", src, "--limit", limit])  # fmt: skip
    scores: dict[str, dict[str, list[float]]] = {}

    def measure(point: str, model: Path) -> None:  # each point right after it exists: a failure shows early
        tokenizer = args.tokenizer if point == "untrained" else None
        folder = out / "eval" / point
        run(f"eval {point}", eval_command(args, model, dev_rows, folder, tokenizer), done=folder / "table.md")
        scores[point] = {"accuracy": row_scores(out / "eval" / point)}

    measure("untrained", args.model)
    warm = out / "warmup_model"
    run("warm-up", warmup_command(args, train_rows, warm), done=warm / "warmup.json")
    measure("warmup", warm)
    train = [reasoning, "train", "--config", "grpo", "--engine", args.engine, "--train-data", train_rows]
    run("train", [*train, "--score-workers", "1", *train_overrides(args, warm, out / "grpo")])
    measure("rl", out / "grpo" / "checkpoints" / f"step_{args.steps}")
    subprocess.run([reasoning, "plot", out / "grpo", "--out", out / "curves.png"], check=False)
    comparisons = {
        "rl - warmup (accuracy)": ("accuracy", "warmup", "rl"),
        "rl - untrained (accuracy)": ("accuracy", "untrained", "rl"),
        "warmup - untrained (accuracy)": ("accuracy", "untrained", "warmup"),
    }
    sizes = {"train_rows": args.train_rows, "dev_rows": args.dev_rows, "grpo_steps": args.steps}
    title = "GSM8K, SmolLM2-135M-Instruct, greedy held-out accuracy"
    write_report(out, title, scores=scores, comparisons=comparisons, runner=run, extra=sizes)


if __name__ == "__main__":
    main()
