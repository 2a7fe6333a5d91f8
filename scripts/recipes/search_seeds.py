"""Pool several seeds of `recipe-search`: RL minus the warmed-up model per dev question, averaged over the runs,
with the recipe's paired bootstrap over questions.

    python3 scripts/recipes/search_seeds.py runs/recipe-search runs/recipe-search-seed1

Every run scores the same dev questions (the evals keep seed 0), so a question's difference can be averaged over
the runs' seeds (warm-up order and GRPO) before resampling questions: one interval for "does RL beat its start
across seeds", where each run alone has one seed's noise.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from recipe_common import paired_bootstrap
from search import row_scores

METRICS = ("f1", "em")


def mean_over_runs(runs: list[dict[str, list[float]]], metric: str) -> list[float]:
    """Each question's score averaged over the runs (all runs must hold the same questions in the same order)."""
    lengths = {len(run[metric]) for run in runs}
    if len(lengths) != 1:
        raise SystemExit(f"the runs scored different numbers of dev questions: {sorted(lengths)}")
    return [sum(values) / len(values) for values in zip(*(run[metric] for run in runs), strict=True)]


def pooled(folders: list[Path]) -> dict[str, dict[str, Any]]:
    """{label: interval} for each run alone and for all runs pooled, RL minus warm-up, per metric."""
    before = [row_scores(folder / "eval" / "warmup") for folder in folders]
    after = [row_scores(folder / "eval" / "rl") for folder in folders]
    out: dict[str, dict[str, Any]] = {}
    for metric in METRICS:
        for folder, b, a in zip(folders, before, after, strict=True):
            out[f"{folder.name} rl - warmup ({metric})"] = asdict(paired_bootstrap(b[metric], a[metric]))
        pooled_before, pooled_after = mean_over_runs(before, metric), mean_over_runs(after, metric)
        out[f"{len(folders)} runs pooled rl - warmup ({metric})"] = asdict(
            paired_bootstrap(pooled_before, pooled_after)
        )
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", type=Path, help="recipe-search run folders (each with eval/warmup, eval/rl)")
    args = p.parse_args(argv)
    missing = [str(f) for f in args.runs if not (f / "eval" / "rl" / "predictions_search.jsonl").exists()]
    if missing:
        raise SystemExit(f"no eval/rl/predictions_search.jsonl in {', '.join(missing)}: run the recipe to its end")
    print("| difference | mean | 95% paired bootstrap |\n|---|---|---|")
    for label, ci in pooled(args.runs).items():
        print(f"| {label} | {ci['mean']:+.3f} | [{ci['low']:+.3f}, {ci['high']:+.3f}] |")


if __name__ == "__main__":
    main()
