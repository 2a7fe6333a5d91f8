"""The command line: overrides anywhere among the options, every flag described with its default."""

from __future__ import annotations

import argparse

import pytest
from rlloom_apps.search_agent.cli import build_parser, parse


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(action.choices)


@pytest.mark.parametrize(
    ("argv", "overrides"),
    [
        (["train", "model.path=m", "--train-data", "rows.jsonl", "--index", "idx", "trainer.total_steps=1"],
         ["model.path=m", "trainer.total_steps=1"]),
        (["demo", "actor.lr=5e-4", "--steps", "2", "rollout.n=4", "--seed", "1", "a.b=c"],
         ["actor.lr=5e-4", "rollout.n=4", "a.b=c"]),
    ],
)  # fmt: skip
def test_overrides_are_taken_anywhere_among_the_options(argv: list[str], overrides: list[str]) -> None:
    assert parse(build_parser(), argv).overrides == overrides


def test_every_flag_is_described() -> None:
    for name, sub in subcommands(build_parser()).items():
        for action in sub._actions:
            if action.dest != "help":
                assert action.help, f"{name} {action.option_strings or action.dest} has no help"
        assert "(default: None)" not in sub.format_help()


def test_the_limits_group_shows_search_r1s_numbers() -> None:
    text = " ".join(subcommands(build_parser())["eval"].format_help().split())
    for shown in ("(default: 3)", "(default: 5)", "(default: 500)", "(default: 4096)"):
        assert shown in text
