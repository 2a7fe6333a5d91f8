"""Command-line pieces every app's CLI shares: help that shows defaults, `key=value` overrides anywhere among
the options, and a YAML --config checked before anything reads it."""

from __future__ import annotations

import argparse
import difflib
import functools
import json
import re
import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import ParamSpec, TypeVar

T = TypeVar("T")
P = ParamSpec("P")

INTERRUPTED_EXIT = 130
"""A run stopped by Ctrl-C exits as shells report SIGINT (128 + 2)."""

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
    option, so `train a=1 --train-data x b=2` would otherwise refuse `b=2`).

    Flags must be spelled out: argparse's prefix matching is turned off on every (sub)parser, since `--epoch 1`
    quietly meaning `--epochs` would change meaning once another flag shares the prefix. A flag the chosen
    subcommand does not know is refused first (before a missing required flag, which argparse would report
    instead) by that subcommand's parser, so the usage line is its own, with the flags it meant as a suggestion;
    any other leftover argument is refused the same way after parsing."""
    _no_abbreviations(parser)
    tokens = sys.argv[1:] if argv is None else list(argv)
    command, unknown = unknown_flags(parser, tokens)
    if unknown and not {"-h", "--help"} & set(tokens):  # before argparse's "required" error, which would hide them
        command.error(f"unrecognized arguments: {' '.join(unknown)}{suggestion(unknown, command)}")
    args, extra = parser.parse_known_args(tokens)
    if hasattr(args, "overrides"):
        args.overrides = [*args.overrides, *(e for e in extra if OVERRIDE.match(e))]
        extra = [e for e in extra if not OVERRIDE.match(e)]
    if extra:
        command = command_parser(parser, args)
        command.error(f"unrecognized arguments: {' '.join(extra)}{suggestion(extra, command)}")
    return args


def command_parser(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The parser of the subcommand `args` chose (`reasoning warmup`'s, not `reasoning`'s), so that an error
    shows that subcommand's usage line; `parser` itself when it has no subcommands."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            chosen = action.choices.get(getattr(args, action.dest, None) or "")
            if chosen is not None:
                return command_parser(chosen, args)
    return parser


def unknown_flags(parser: argparse.ArgumentParser, tokens: list[str]) -> tuple[argparse.ArgumentParser, list[str]]:
    """The subcommand parser `tokens` choose (its first plain token, level by level) and the `--flags` among the
    tokens after it that this parser does not know (`--flag=value` by its flag; nothing after a bare `--`)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            first = next((i for i, token in enumerate(tokens) if not token.startswith("-")), None)
            chosen = action.choices.get(tokens[first]) if first is not None else None
            return unknown_flags(chosen, tokens[first + 1 :]) if chosen and first is not None else (parser, [])
    known = _long_flags(parser)
    given = tokens[: tokens.index("--")] if "--" in tokens else tokens
    return parser, [t for t in given if t.startswith("--") and t.split("=", 1)[0] not in known]


def suggestion(extra: list[str], parser: argparse.ArgumentParser) -> str:
    """`; did you mean --x?` for an unknown flag among `extra` that starts or nearly spells some of `parser`'s
    flags (at most three; each hint names its flag when several flags are unknown); "" for garbage: no guess."""
    known = _long_flags(parser)
    unknown = [f for f in (item.split("=", 1)[0] for item in extra) if f.startswith("--") and f not in ("--", *known)]
    hints = []
    for flag in unknown:
        longer = [k for k in known if k.startswith(flag)]  # what argparse's prefix matching would have taken
        close = [*longer, *(k for k in difflib.get_close_matches(flag, known, n=3, cutoff=0.75) if k not in longer)]
        if close:
            named = f"{flag}: " if len(unknown) > 1 else ""
            hints.append(f"{named}did you mean {' or '.join(close[:3])}?")
    return f"; {'; '.join(hints)}" if hints else ""


def _long_flags(parser: argparse.ArgumentParser) -> list[str]:
    return [flag for action in parser._actions for flag in action.option_strings if flag.startswith("--")]


def _no_abbreviations(parser: argparse.ArgumentParser) -> None:
    """`allow_abbrev=False` on `parser` and every subcommand parser under it."""
    parser.allow_abbrev = False
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                _no_abbreviations(sub)


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


def last_logged_step(output_dir: Path) -> int:
    """The highest `step` in the run folder's metrics.jsonl (0 when none was logged yet)."""
    path = output_dir / "metrics.jsonl"
    step = 0
    if path.is_file():
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:  # a line cut short by the interrupt itself
                continue
            if isinstance(record, dict) and isinstance(record.get("step"), int):
                step = max(step, record["step"])
    return step


def last_checkpoint_step(output_dir: Path) -> int | None:
    """The step of the checkpoint `checkpoints/latest` names (what a resume starts from), None without one."""
    pointer = output_dir / "checkpoints" / "latest"
    name = pointer.read_text(encoding="utf-8").strip() if pointer.is_file() else ""
    match = re.fullmatch(r"step_(\d+)", name)
    return int(match.group(1)) if match else None


def interrupted_message(output_dir: Path, argv: list[str]) -> str:
    """One line: the step reached, where a resume starts and the command that resumes."""
    saved = last_checkpoint_step(output_dir)
    start = f"resumes from the step {saved} checkpoint" if saved is not None else "starts over: no checkpoint yet"
    return (
        f"interrupted at step {last_logged_step(output_dir)} ({output_dir}); "
        f"the same command {start}: {shlex.join([Path(argv[0]).name, *argv[1:]])}"
    )


def run_interruptible(run: Callable[[], T], output_dir: str | Path, argv: list[str] | None = None) -> T:
    """`run()`, but Ctrl-C ends it with one line on stderr (no traceback) and exit status 130.

    The trainer writes checkpoints atomically, so whatever was interrupted, `trainer.resume=auto` (the default)
    continues from the last complete checkpoint when the same command runs again.
    """
    try:
        return run()
    except KeyboardInterrupt:
        print(interrupted_message(Path(output_dir), argv if argv is not None else sys.argv), file=sys.stderr)
        raise SystemExit(INTERRUPTED_EXIT) from None


def quiet_interrupt(main: Callable[P, T]) -> Callable[P, T]:
    """A console script's `main` that Ctrl-C ends with one line and exit 130 wherever it lands (loading torch, a
    model, an eval); `run_interruptible` words the line for training, whose step and resume matter."""

    @functools.wraps(main)
    def wrapped(*args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return main(*args, **kwargs)
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            raise SystemExit(INTERRUPTED_EXIT) from None

    return wrapped
