"""Recipe: a HotpotQA search agent with SmolLM2-135M-Instruct, BM25 and vLLM, one command (`nox -s recipe-search`).

prepare-data -> `rlloom-retrieval build-index` (BM25 over the questions' own passages) -> `search-agent warmup`
(demonstrations through the retriever) -> `search-agent train --config grpo --engine vllm` (Search-R1's v0.3 format
reward with the answer graded by F1, no KL term) -> `search-agent eval` on 100 held-out dev questions at three
points (untrained, warmed up, after RL): EM, F1, searches per episode and the valid-format rate, with a paired
bootstrap interval for RL minus the warmed-up model. A question's score is the mean over --eval-samples seeded
conversations at --eval-temperature (default 4 at 0.6, as recipe-gsm8k): one greedy answer per question left RL -
warm-up at F1 +0.017 with a 95% interval of [-0.023, +0.060]; `--eval-samples 1 --eval-temperature 0` gives that
greedy figure. The samples share one engine start and decode batched: on 20 untrained dev questions (vLLM eager,
loaded) avg@4 took 95 s against greedy's 59 s (its conversations 66 s against 30 s).
Data: apps/search_agent/recipes/hotpotqa/ (400 train and 100 dev questions, disjoint, and their 4,858 passages;
see SOURCE.md there). At these defaults (50 warm-up steps, 10 GRPO steps of 8 x 4) the chain takes about 55
minutes on two idle cores (docs/recipes.md). A GRPO step is 2.5-3 minutes here, so each extra 20 steps adds an
hour.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rlloom.agent import SearchEnvConfig

sys.path.insert(0, str(Path(__file__).parent))
import recipe_common
from recipe_common import ROOT, Chain, chain_parser, cpu_grpo_overrides, read_jsonl, tool

DATA = ROOT / "apps" / "search_agent" / "recipes" / "hotpotqa"
INFORMATION = re.compile(r"\n\n<information>(.*?)</information>\n\n", re.DOTALL)


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = chain_parser(__doc__, "search-agent", "recipe-search", steps=10, lr=1e-5)
    p.add_argument("--corpus", type=Path, default=DATA / "corpus.jsonl.gz", help="passages (default: %(default)s)")
    p.add_argument("--warmup-steps", type=int, default=50, help="supervised steps (default: %(default)s)")
    p.add_argument("--max-turns", type=int, default=3, help="model turns per conversation (default: %(default)s)")
    p.add_argument("--max-tokens", type=int, default=64, help="tokens per model turn (default: %(default)s)")
    p.add_argument("--eval-samples", type=int, default=4, help="conversations per dev question (default: %(default)s)")
    p.add_argument("--eval-temperature", type=float, default=0.6, help="0: greedy (default: %(default)s)")
    return p.parse_args(argv)


def limits(args: argparse.Namespace) -> list[str]:
    """The measuring limits eval and warm-up share with training's `search.*`."""
    return ["--max-turns", str(args.max_turns), "--max-tokens-per-turn", str(args.max_tokens),
            "--max-obs-tokens", "256", "--max-total-tokens", "2048"]  # fmt: skip


def eval_flags(args: argparse.Namespace) -> list[str]:
    """`search-agent eval`'s sampling: --eval-samples conversations per question at --eval-temperature, seeded."""
    if args.eval_samples < 1:
        raise SystemExit(f"--eval-samples must be at least 1, got {args.eval_samples}")
    if args.eval_samples > 1 and args.eval_temperature <= 0:
        raise SystemExit(
            f"--eval-samples {args.eval_samples} needs --eval-temperature > 0 (greedy samples are all alike); "
            "pass --eval-samples 1 for the greedy figure"
        )
    return ["--n", str(args.eval_samples), "--temperature", str(args.eval_temperature), "--seed", "0"]


def title(args: argparse.Namespace) -> str:
    """The report's title, saying how each question was scored."""
    how = "greedy" if args.eval_temperature == 0 else f"avg@{args.eval_samples} at T {args.eval_temperature}"
    return f"HotpotQA search agent, SmolLM2-135M-Instruct, BM25, held-out ({how})"


def train_overrides(args: argparse.Namespace, start: Path, run: Path) -> list[str]:
    """The CPU cut of the grpo config (recipe_common, no KL term) with the recipe's limits and Search-R1's v0.3
    format reward graded by the answer's F1.

    Why F1 and no KL (28th session, the same seed-0 warm-up): at lr 1e-5 over 10 steps, EM-graded GRPO at T 0.6
    moved held-out F1 by -0.004 [-0.027, +0.020]; F1-graded at the config's T 1.0 by +0.035 [+0.002, +0.070]. A
    135M model is rarely exactly right, so EM leaves most groups of 4 with equal rewards; F1 credits the partly
    right answers. The shared CPU cut drops the KL term: its reference forward was 28 s of a 181 s step here, time
    that buys two more steps."""
    search = [
        "actor.warmup_ratio=0",
        f"search.max_turns={args.max_turns}",
        "search.max_obs_tokens=256",
        "search.max_total_tokens=2048",
        "search.format_reward={answer_score: f1}",
    ]
    return cpu_grpo_overrides(args, start, run, search)


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
    """Per-question EM, F1, searches and valid format, in dev-row order: each the mean over the question's
    sampled conversations (its records share data_source and index; questions in order of first appearance,
    which is the dev rows' order)."""
    records: list[dict[str, Any]] = read_jsonl(folder / "predictions_search.jsonl")
    by_question: dict[tuple[str, Any], list[dict[str, Any]]] = {}
    for r in records:
        if r.get("index") is None:
            raise SystemExit(f"{folder}/predictions_search.jsonl: a record has no index; make rows with prepare-data")
        by_question.setdefault((str(r["data_source"]), r["index"]), []).append(r)
    samples = {len(group) for group in by_question.values()}
    if len(samples) > 1:
        raise SystemExit(f"{folder}/predictions_search.jsonl: questions have {sorted(samples)} samples, not one count")

    def mean(values: Sequence[float]) -> float:
        return sum(values) / len(values)

    groups = list(by_question.values())
    return {
        "em": [mean([float(r["em"]) for r in g]) for g in groups],
        "f1": [mean([float(r["f1"]) for r in g]) for g in groups],
        "searches": [mean([float(r["searches"]) for r in g]) for g in groups],
        "format_valid": [mean([format_valid(str(r["response"])) for r in g]) for g in groups],
    }


def main(argv: list[str] | None = None) -> None:
    args = parse(sys.argv[1:] if argv is None else argv)
    index = args.out.resolve() / "index"
    chain = Chain(args, "search-agent", ["--index", index, *limits(args), *eval_flags(args)], row_scores)
    chain.prepare(DATA, ["--data-source", "hotpotqa"])
    chain.run("build-index", [tool("rlloom-retrieval"), "build-index", "--corpus", args.corpus, "--out", index])
    chain.measure("untrained", args.model)
    own = ["--index", index, "--steps", args.warmup_steps, *limits(args)]
    warm = chain.warm_up(recipe_common.warmup_command(args, "search-agent", chain.train_rows, chain.warm, own))
    chain.measure("warmup", warm)
    chain.measure("rl", chain.train(["--index", index, *train_overrides(args, chain.warm, chain.grpo)]))
    comparisons = {
        "rl - warmup (f1)": ("f1", "warmup", "rl"),
        "rl - warmup (em)": ("em", "warmup", "rl"),
        "rl - untrained (f1)": ("f1", "untrained", "rl"),
    }
    chain.report(title(args), comparisons)


if __name__ == "__main__":
    main()
