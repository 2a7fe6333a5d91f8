"""`rlloom-rewards score IN.jsonl --scorer gsm8k --out OUT.jsonl`: score a JSONL file of responses in a pool.

Each input line is a JSON object; the response and ground truth are read by key (dotted keys reach into nested
objects, e.g. `reward_model.ground_truth` in veRL/Search-R1 rows). Without `--scorer`, each row's
`data_source` picks the scorer. Every input line gives one output line, in order: the row plus `score`,
`score_components`, `score_error` (bad lines give `{"line": n, "input_error": ...}`), so nothing is silently
dropped; bad lines are also listed on stderr and make the exit status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from rlloom.rewards.batch import DEFAULT_TIMEOUT, ScoreItem, score_batch
from rlloom.rewards.registry import ScorerLoadError, get_scorer
from rlloom.rewards.types import ScoreResult

_MISSING = object()


def _lookup(row: dict[str, Any], key: str) -> Any:
    value: Any = row
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            return _MISSING
        value = value[part]
    return value


def read_items(
    path: Path, *, scorer: str | None, response_key: str, gt_keys: Sequence[str]
) -> tuple[list[dict[str, Any] | None], list[ScoreItem], list[tuple[int, str]]]:
    """Parse the file: rows (None for bad lines), items for the good ones, and (line number, problem) pairs."""
    rows: list[dict[str, Any] | None] = []
    items: list[ScoreItem] = []
    bad: list[tuple[int, str]] = []
    with path.open("rb") as handle:
        for number, raw in enumerate(handle, 1):
            text = raw.decode("utf-8", errors="replace").strip()
            if not text:
                rows.append(None)
                bad.append((number, "empty line"))
                continue
            try:
                row = json.loads(text)
                if not isinstance(row, dict):
                    raise ValueError(f"expected a JSON object, got {type(row).__name__}")
                response = _lookup(row, response_key)
                if not isinstance(response, str):
                    raise ValueError(f"key {response_key!r} is missing or not a string; set --response-key")
                ground_truth = next((v for k in gt_keys if (v := _lookup(row, k)) is not _MISSING), _MISSING)
                if ground_truth is _MISSING:
                    raise ValueError(f"none of the keys {list(gt_keys)} is present; set --gt-key")
                source = row.get("data_source")
                if scorer is None and not isinstance(source, str):
                    raise ValueError("no --scorer given and the row has no string 'data_source'")
                extra = row.get("extra_info")
                extra = extra if isinstance(extra, dict) else {}
                item = ScoreItem(
                    response=response, ground_truth=ground_truth, scorer=scorer, data_source=source, extra_info=extra
                )
            except ValueError as exc:  # JSONDecodeError and pydantic's ValidationError are ValueErrors
                rows.append(None)
                bad.append((number, str(exc).splitlines()[0][:300]))
                continue
            rows.append(row)
            items.append(item)
    return rows, items, bad


def summary_table(items: Sequence[ScoreItem], results: Sequence[ScoreResult], n_bad: int) -> Table:
    """Per scorer: rows, mean score, share with score > 0, errors by kind."""
    groups: dict[str, list[ScoreResult]] = defaultdict(list)
    for item, result in zip(items, results, strict=True):
        groups[item.scorer or item.data_source or "?"].append(result)
    table = Table(title=f"rlloom-rewards: {len(results)} scored, {n_bad} bad input lines")
    for column in ("scorer", "rows", "mean score", "score > 0", "errors", "timeouts", "crashes"):
        table.add_column(column, justify="left" if column == "scorer" else "right")
    for name, group in sorted(groups.items()):
        kinds = [error_kind(r) for r in group]
        table.add_row(
            name, str(len(group)), f"{sum(r.score for r in group) / len(group):.4f}",
            f"{sum(r.score > 0 for r in group) / len(group):.1%}", str(kinds.count("error")),
            str(kinds.count("timeout")), str(kinds.count("crash")),
        )  # fmt: skip
    return table


def error_kind(result: ScoreResult) -> str | None:
    """None (no error), "timeout" (the scoring worker's deadline, or a program that ran into the code sandbox's
    time limit: a score of 0, not an error, but worth its column), "crash" (the worker died) or "error" (anything
    else); each result is counted in at most one summary column."""
    if result.error is None:
        return "timeout" if result.details.get("status") == "timeout" else None
    kind = result.details.get("error_kind") or result.details.get("status")
    return kind if kind in ("timeout", "crash") else "error"


def cmd_score(args: argparse.Namespace) -> int:
    console = Console(stderr=True, soft_wrap=True)
    if not args.input.is_file():
        console.print(f"[red]input file {str(args.input)!r} does not exist[/red]")
        return 1
    if args.out != Path("-"):
        if args.out.is_dir():
            args.parser.error(f"--out {args.out} is a folder; give a file path, e.g. {args.out / 'scored.jsonl'}")
        args.out.parent.mkdir(parents=True, exist_ok=True)
    if args.scorer is not None:  # a misspelt --scorer would otherwise score every row 0 and exit 0
        try:
            get_scorer(args.scorer)
        except ScorerLoadError as exc:
            args.parser.error(f"--scorer: {exc}")
    gt_keys = [args.gt_key] if args.gt_key else ["ground_truth", "reward_model.ground_truth"]
    rows, items, bad = read_items(args.input, scorer=args.scorer, response_key=args.response_key, gt_keys=gt_keys)
    for number, problem in bad[:20]:
        console.print(f"[yellow]{args.input}:{number}: skipped: {problem}[/yellow]")
    if len(bad) > 20:
        console.print(f"[yellow]... and {len(bad) - 20} more bad lines (see input_error in the output)[/yellow]")
    results = score_batch(items, workers=args.workers, timeout=args.timeout, progress=not args.quiet)
    out = args.out.open("w", encoding="utf-8") if args.out != Path("-") else sys.stdout
    problems = dict(bad)
    scored = iter(results)
    try:
        for number, row in enumerate(rows, 1):
            if row is None:
                record: dict[str, Any] = {"line": number, "input_error": problems[number]}
            else:
                result = next(scored)
                record = {**row, "score": result.score, "score_components": result.components,
                          "score_extracted": result.extracted, "score_error": result.error}  # fmt: skip
            out.write(json.dumps(record, ensure_ascii=False, default=str) + "\n")
    finally:
        if out is not sys.stdout:
            out.close()
    console.print(summary_table(items, results, len(bad)))
    return 2 if bad else 0


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows each flag's default, except where there is none to show (None, a switch's False)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None or action.default is False:
            return action.help
        return super()._get_help_string(action)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rlloom-rewards",
        description=__doc__.split("\n\n")[0],
        allow_abbrev=False,  # flags spelled out
    )
    commands = parser.add_subparsers(dest="command", required=True)
    score = commands.add_parser(
        "score", help="score a JSONL file of responses", formatter_class=_HelpFormatter, allow_abbrev=False
    )
    score.add_argument("input", type=Path, help="JSONL file, one object per line")
    score.add_argument(
        "--scorer",
        default=None,
        help="data_source name (gsm8k, nq, ...) or module:function / file.py:function "
        "(default: each row's data_source)",
    )
    score.add_argument("--response-key", default="response", help="key of the response text (dotted for nesting)")
    score.add_argument(
        "--gt-key", default=None, help="key of the ground truth (default: ground_truth, then reward_model.ground_truth)"
    )
    score.add_argument("--out", type=Path, required=True, help="output JSONL ('-' for stdout)")
    score.add_argument(
        "--workers", type=int, default=None, help="worker processes (default: CPU count; 0 = in-process)"
    )
    score.add_argument(
        "--timeout", type=float, default=DEFAULT_TIMEOUT, help="seconds per item before its worker is killed"
    )
    score.add_argument("--quiet", action="store_true", help="no progress bar")
    score.set_defaults(func=cmd_score, parser=score)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.workers is not None and args.workers < 0:
        args.parser.error(f"--workers must be 0 (score in this process) or more, got {args.workers}")
    if args.timeout <= 0:
        args.parser.error(f"--timeout must be more than 0 seconds, got {args.timeout:g}")
    return int(args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())
