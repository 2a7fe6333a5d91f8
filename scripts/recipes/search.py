"""Recipe: a HotpotQA search agent with SmolLM2-135M-Instruct, BM25 and vLLM, one command (`nox -s recipe-search`).

prepare-data -> `rlloom-retrieval build-index` (BM25 over the questions' own passages) -> `search-agent warmup`
(demonstrations through the retriever) -> `search-agent train --config grpo --engine vllm` (Search-R1's v0.3
format reward) -> greedy `search-agent eval` on 100 held-out dev questions at three points (untrained, warmed up,
after RL): EM, F1, searches per episode and the valid-format rate, with a paired bootstrap interval for RL minus
the warmed-up model. Data: apps/search_agent/recipes/hotpotqa/ (400 train and 100 dev questions, disjoint, and
their 4,858 passages; see SOURCE.md there). Defaults aim at about an hour on two idle cores
(not timed on one: docs/recipes.md).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from rlloom.agent import SearchEnvConfig

sys.path.insert(0, str(Path(__file__).parent))
from recipe_common import Runner, read_jsonl, tool, write_report

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "apps" / "search_agent" / "recipes" / "hotpotqa"
MODEL = ROOT / "models" / "smollm2-135m-instruct"
INFORMATION = re.compile(r"\n\n<information>(.*?)</information>\n\n", re.DOTALL)


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, default=MODEL, help="instruct model folder (default: %(default)s)")
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "recipe-search", help="run folder (%(default)s)")
    p.add_argument("--train-rows", type=int, default=400, help="training questions used (default: %(default)s)")
    p.add_argument("--dev-rows", type=int, default=100, help="held-out questions measured (default: %(default)s)")
    p.add_argument("--corpus", type=Path, default=DATA / "corpus.jsonl.gz", help="passages (default: %(default)s)")
    p.add_argument("--warmup-steps", type=int, default=50, help="supervised steps (default: %(default)s)")
    p.add_argument("--warmup-lr", type=float, default=1e-5, help="supervised learning rate (default: %(default)s)")
    p.add_argument("--steps", type=int, default=30, help="GRPO steps (default: %(default)s)")
    p.add_argument("--prompts", type=int, default=8, help="questions per GRPO step (default: %(default)s)")
    p.add_argument("--n", type=int, default=4, help="conversations per question (default: %(default)s)")
    p.add_argument("--lr", type=float, default=5e-6, help="GRPO learning rate (default: %(default)s)")
    p.add_argument("--max-turns", type=int, default=3, help="model turns per conversation (default: %(default)s)")
    p.add_argument("--max-tokens", type=int, default=64, help="tokens per model turn (default: %(default)s)")
    p.add_argument("--engine", default="vllm", choices=["vllm", "hf"], help="rollout/eval engine (default: vllm)")
    p.add_argument("--tokenizer", type=Path, default=None, help="tokenizer folder when not in --model")
    p.add_argument("overrides", nargs="*", help="extra `search-agent train` overrides, e.g. actor.lr=1e-5")
    return p.parse_args(argv)


def limits(args: argparse.Namespace) -> list[str]:
    """The measuring limits eval and warm-up share with training's `search.*`."""
    return ["--max-turns", str(args.max_turns), "--max-tokens-per-turn", str(args.max_tokens),
            "--max-obs-tokens", "256", "--max-total-tokens", "2048"]  # fmt: skip


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
        "rollout.vllm.cpu_kvcache_space_gib=1",
        f"actor.mini_batch_size={args.prompts}",
        f"actor.lr={args.lr}",
        "actor.warmup_ratio=0",
        "actor.warmup_steps=0",
        f"trainer.total_steps={args.steps}",
        f"trainer.save_every={args.steps}",
        "trainer.val_every=0",
        "trainer.val_before_train=false",
        "trainer.device=cpu",
        "trainer.trackers=[console,jsonl]",
        f"trainer.output_dir={run}",
        f"search.max_turns={args.max_turns}",
        "search.max_obs_tokens=256",
        "search.max_total_tokens=2048",
        "search.format_reward={}",
    ]
    if args.tokenizer is not None:
        out.append(f"model.tokenizer_path={args.tokenizer}")
    return [*out, *args.overrides]


def format_valid(response: str) -> float:
    """Search-R1's valid-sequence check on an eval response, read as the format reward reads a conversation:
    `<information>` blocks are retrieval, the invalid-action hint is the environment, the rest is the model."""
    from rlloom_apps.search_agent.format_reward import Segment, sequence_check

    hint = SearchEnvConfig().invalid_action_text
    segments: list[Segment] = []
    pieces = INFORMATION.split(response)
    for i, piece in enumerate(pieces):
        if i % 2:
            segments.append(Segment("information", piece))
            continue
        for j, text in enumerate(piece.split(hint)):
            if j:
                segments.append(Segment("environment", hint))
            if text:
                segments.append(Segment("model", text))
    return float(sequence_check(segments).score)


def row_scores(folder: Path) -> dict[str, list[float]]:
    """Per-question EM, F1, searches and valid format, in dev-row order."""
    records: list[dict[str, Any]] = read_jsonl(folder / "predictions_search.jsonl")
    return {
        "em": [float(r["em"]) for r in records],
        "f1": [float(r["f1"]) for r in records],
        "searches": [float(r["searches"]) for r in records],
        "format_valid": [format_valid(str(r["response"])) for r in records],
    }


def main(argv: list[str] | None = None) -> None:
    args = parse(sys.argv[1:] if argv is None else argv)
    if not (args.model / "config.json").exists():
        raise SystemExit(f"--model {args.model}: no config.json there; write SmolLM2 with `python3 -m nox -s smollm2`")
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    run = Runner(out / "commands.log")
    agent = tool("search-agent")
    train_rows, dev_rows, index = out / "rows" / "train.jsonl", out / "rows" / "dev.jsonl", out / "index"
    for rows, src, limit in ((train_rows, "train", args.train_rows), (dev_rows, "dev", args.dev_rows)):
        prepare = [agent, "prepare-data", "--data-source", "hotpotqa", "--input", DATA / f"{src}.jsonl"]
        run(f"prepare-data {src}", [*prepare, "--out", rows, "--split", src, "--limit", limit])
    run("build-index", [tool("rlloom-retrieval"), "build-index", "--corpus", args.corpus, "--out", index])
    tok = ["--tokenizer", args.tokenizer] if args.tokenizer is not None else []
    scores: dict[str, dict[str, list[float]]] = {}

    def measure(point: str, model: Path) -> None:  # each point right after it exists: a failure shows early
        device = ["--device", "cpu"] if args.engine == "hf" else []
        run(f"eval {point}", [agent, "eval", "--model", model, *(tok if point == "untrained" else []),
                              "--engine", args.engine, *device, "--data", dev_rows, "--index", index, *limits(args),
                              "--out", out / "eval" / point], done=out / "eval" / point / "table.md")  # fmt: skip
        scores[point] = row_scores(out / "eval" / point)

    measure("untrained", args.model)
    warm = out / "warmup_model"
    run("warm-up", [agent, "warmup", "--model", args.model, *tok, "--train-data", train_rows, "--index", index,
                    "--out", warm, "--steps", args.warmup_steps, "--lr", args.warmup_lr, *limits(args)],
        done=warm / "warmup.json")  # fmt: skip
    measure("warmup", warm)
    train = [agent, "train", "--config", "grpo", "--engine", args.engine, "--train-data", train_rows, "--index", index]
    run("train", [*train, *train_overrides(args, warm, out / "grpo")])
    measure("rl", out / "grpo" / "checkpoints" / f"step_{args.steps}")
    subprocess.run([tool("reasoning"), "plot", out / "grpo", "--out", out / "curves.png"], check=False)
    comparisons = {
        "rl - warmup (f1)": ("f1", "warmup", "rl"),
        "rl - warmup (em)": ("em", "warmup", "rl"),
        "rl - untrained (f1)": ("f1", "untrained", "rl"),
    }
    sizes = {"train_rows": args.train_rows, "dev_rows": args.dev_rows, "grpo_steps": args.steps}
    title = "HotpotQA search agent, SmolLM2-135M-Instruct, BM25, greedy held-out"
    write_report(out, title, scores=scores, comparisons=comparisons, runner=run, extra=sizes)


if __name__ == "__main__":
    main()
