"""Command-line pieces every app's CLI shares: help that shows defaults, `key=value` overrides anywhere among
the options, and a YAML --config checked before anything reads it."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

OVERRIDE = re.compile(r"^[A-Za-z_][\w.\-]*=")
"""A dotted config override on the command line (`actor.lr=1e-6`)."""


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows each flag's default, except where there is none to show (None, a switch's False, no overrides)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None or action.default is False or action.default == []:
            return action.help
        return super()._get_help_string(action)


def parse(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """Parse, taking `key=value` overrides anywhere among the options (argparse ends a positional list at the first
    option, so `train a=1 --train-data x b=2` would otherwise refuse `b=2`)."""
    args, extra = parser.parse_known_args(argv)
    if hasattr(args, "overrides"):
        args.overrides = [*args.overrides, *(e for e in extra if OVERRIDE.match(e))]
        extra = [e for e in extra if not OVERRIDE.match(e)]
    if extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def check_yaml(parser: argparse.ArgumentParser, config: str) -> None:
    """A YAML --config with a syntax error is named with its line, before anything else reads it."""
    import yaml

    path = Path(config)
    if path.suffix in (".yaml", ".yml") and path.is_file():
        try:
            yaml.safe_load(path.read_text(encoding="utf-8"))
        except yaml.YAMLError as err:
            mark = getattr(err, "problem_mark", None)
            where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
            problem = getattr(err, "problem", None) or str(err).splitlines()[0]
            parser.error(f"--config {where}: not valid YAML ({problem}); fix the file")


def check_file_arguments(parser: argparse.ArgumentParser, source: Path, out: Path, out_name: str) -> None:
    """`--input` must be an existing file and `--out` neither a folder nor the input; each refusal names the flag."""
    if source.is_dir():
        parser.error(f"--input {source} is a folder; give the file, e.g. {source / 'test.jsonl'}")
    if not source.is_file():
        parser.error(f"--input {source} does not exist")
    if out.is_dir():
        parser.error(f"--out {out} is a folder; give a file path, e.g. {out / out_name}")
    if out.resolve() == source.resolve():
        parser.error(f"--out {out} is the --input file; it would be overwritten: give another path")
