"""The `demo` subcommand every app's CLI offers: the same flags, the same error handling, the same report.

A demo's `run_demo(output_dir=, steps=, seed=, overrides=)` returns a result with `output_dir`, `seconds`,
`val_curve` and `train_curve`; its `before_after_table(result)` renders the table written to before_after.md.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any


def add_demo_command(
    commands: Any, *, help: str, description: str, default_steps: int, seed_help: str, run_prefix: str
) -> argparse.ArgumentParser:
    """A `demo` subparser: --steps, --seed, --out and dotted trainer-config overrides."""
    demo: argparse.ArgumentParser = commands.add_parser("demo", help=help, description=description)
    demo.add_argument("--steps", type=int, default=None, help=f"GRPO steps (default: demo.yaml's {default_steps})")
    demo.add_argument("--seed", type=int, default=0, help=seed_help)
    demo.add_argument("--out", type=Path, default=None, help=f"run folder (default: runs/{run_prefix}-<timestamp>)")
    demo.add_argument("overrides", nargs="*", metavar="key=value", help="trainer config overrides")
    return demo


def run_demo_command(
    parser: argparse.ArgumentParser,
    args: argparse.Namespace,
    run_demo: Callable[..., Any],
    before_after_table: Callable[[Any], str],
    *,
    title: str,
    ylabel: str = "reward",
) -> None:
    """Run the demo as the parsed flags say; bad flags or overrides exit through `parser.error` with the cause."""
    from pydantic import ValidationError  # imported here: building the parser stays cheap for every subcommand

    from rlloom.core_rl.config.schema import ConfigError
    from rlloom.core_rl.observe.curves import plot_or_draw

    if args.steps is not None and args.steps < 1:
        parser.error(f"--steps must be at least 1, got {args.steps}")
    try:
        result = run_demo(output_dir=args.out, steps=args.steps, seed=args.seed, overrides=args.overrides)
    except (ConfigError, ValidationError, FileExistsError) as err:
        parser.error(str(err))
    print(f"\nrun folder: {result.output_dir} ({result.seconds:.0f} s)")
    print(before_after_table(result))
    print(f"(also in {result.output_dir / 'before_after.md'})")
    curve_png = result.output_dir / "reward_curve.png"
    print(plot_or_draw(result.val_curve, result.train_curve, curve_png, title=title, ylabel=ylabel))
