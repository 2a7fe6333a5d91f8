"""`reasoning filter-rows`: offline difficulty filtering (Skywork-OR1) before `reasoning train`.

Samples every training row n times with the starting model (the same sampling as `reasoning eval`), and writes the
rows it solves sometimes, never always or never: only those give a GRPO group whose rewards differ. The pass rates
and the selection are `rlloom.rewards.difficulty`'s; this module is the command's flags and files.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from rlloom.core_rl.cli import HelpFormatter


def add_filter_parser(commands: Any) -> None:
    from rlloom_apps.reasoning.sampling_flags import add_sampling_arguments

    fr = commands.add_parser(
        "filter-rows",
        help="keep the training rows the model solves sometimes (offline difficulty filtering, Skywork-OR1)",
        description="Sample every row of --data n times with --model (as `reasoning eval` does: set --n, "
        "--temperature and --max-tokens to what training will use), score the samples, and write to --out the rows "
        "whose pass rate lies strictly inside --band, each with extra_info.pass_rate. A row solved never (or every "
        "time) gives a GRPO group of equal rewards: zero advantage, no gradient, and a wasted rollout.",
        formatter_class=HelpFormatter,
    )
    fr.add_argument("--out", required=True, type=Path, help="JSONL file for the rows kept")
    fr.add_argument(
        "--band",
        type=float,
        nargs=2,
        default=[0.0, 1.0],
        metavar=("LOW", "HIGH"),
        help="keep rows with LOW < pass rate < HIGH (Skywork-OR1 keeps (0, 1))",
    )
    fr.add_argument(
        "--eval-out", type=Path, default=None, help="folder for the eval's results.json, table.md and samples_*.jsonl"
    )
    add_sampling_arguments(fr)
    fr.set_defaults(n=8, temperature=1.0, top_p=1.0)  # several samples for a rate; GRPO rollouts sample at T 1, top-p 1


def run_filter_command(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    from pydantic import ValidationError
    from rlloom_apps.reasoning.sampling_flags import sample_and_score

    from rlloom.rewards.difficulty import PassBand, select_by_pass_rate
    from rlloom.rewards.eval_runner import report

    try:
        band = PassBand(low=args.band[0], high=args.band[1])
    except ValidationError as err:
        problems = "; ".join(
            (f"{e['loc'][0]} " if e["loc"] else "") + str(e["msg"]).removeprefix("Value error, ").lower()
            for e in err.errors()
        )
        parser.error(f"--band {args.band[0]:g} {args.band[1]:g}: {problems}")
    if args.out.suffix != ".jsonl":
        parser.error(f"--out {args.out}: give a .jsonl file for the rows kept, e.g. rows/train_filtered.jsonl")
    if args.n < 2:
        print(f"warning: --n {args.n}: a pass rate from one sample is 0 or 1, so (0, 1) keeps nothing", file=sys.stderr)
    rows, settings, result = sample_and_score(parser, args)
    report(result, rows, settings, args.eval_out)
    selection = select_by_pass_rate(rows, result.report.records, band)
    print(selection.summary(band))
    if not selection.kept:
        sys.exit(
            f"filter-rows: no row's pass rate lies in ({band.low:g}, {band.high:g}); nothing written to {args.out}. "
            "Raise --n (more samples find rare successes), widen --band, or start from a stronger (warmed-up) model"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in selection.kept), "utf-8")
    print(f"wrote {len(selection.kept)} rows to {args.out}")
