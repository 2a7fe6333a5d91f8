"""The shared `demo` subcommand: its flags, error exits and report."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from rlloom.core_rl.cli.demo import add_demo_command, run_demo_command
from rlloom.core_rl.config.schema import ConfigError


@dataclass
class Result:
    output_dir: Path
    seconds: float = 1.0
    val_curve: list[tuple[int, float]] = field(default_factory=lambda: [(0, 0.1), (5, 0.9)])
    train_curve: list[tuple[int, float]] = field(default_factory=lambda: [(1, 0.2), (5, 0.8)])


def parser_and_demo() -> tuple[argparse.ArgumentParser, argparse.ArgumentParser]:
    parser = argparse.ArgumentParser(prog="app")
    commands = parser.add_subparsers(dest="command", required=True)
    demo = add_demo_command(
        commands, help="h", description="d", default_steps=40, seed_help="seed", run_prefix="app-demo"
    )
    return parser, demo


def test_flags_and_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    parser, demo = parser_and_demo()
    args = parser.parse_args(["demo", "--steps", "3", "--seed", "2", "--out", str(tmp_path), "actor.lr=1e-3"])
    assert "demo.yaml's 40" in demo.format_help() and "runs/app-demo-<timestamp>" in demo.format_help()
    calls: list[dict[str, Any]] = []

    def run_demo(**kwargs: Any) -> Result:
        calls.append(kwargs)
        return Result(tmp_path)

    run_demo_command(parser, args, run_demo, lambda r: "| table |", title="t")
    assert calls == [{"output_dir": tmp_path, "steps": 3, "seed": 2, "overrides": ["actor.lr=1e-3"]}]
    out = capsys.readouterr().out
    assert f"run folder: {tmp_path}" in out and "| table |" in out and "before_after.md" in out


def test_bad_steps_and_config_errors_exit_with_the_cause(capsys: pytest.CaptureFixture[str]) -> None:
    parser, _ = parser_and_demo()

    def fails(**kwargs: Any) -> Result:
        raise ConfigError("actor.lrr: unknown key; did you mean actor.lr?")

    with pytest.raises(SystemExit):
        run_demo_command(parser, parser.parse_args(["demo", "--steps", "0"]), fails, str, title="t")
    assert "--steps must be at least 1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        run_demo_command(parser, parser.parse_args(["demo"]), fails, str, title="t")
    assert "did you mean actor.lr" in capsys.readouterr().err
