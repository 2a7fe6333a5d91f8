"""A mistyped flag is refused by its subcommand's parser with the close flags it knows, and flags must be spelled
out (no prefix matching). The parser here is built by hand, so the expected usage lines and suggestions are
written from its flags, not from `parse`'s code."""

from __future__ import annotations

import argparse

import pytest

from rlloom.core_rl.cli import command_parser, parse


def app() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="app")
    commands = parser.add_subparsers(dest="command", required=True)
    warm = commands.add_parser("warmup")
    warm.add_argument("--max-tokens-per-micro-batch", type=int, default=1024)
    warm.add_argument("--epochs", type=float, default=2.0)
    warm.add_argument("--val-data", default=None)
    warm.add_argument("--lr", type=float, default=1e-5)
    warm.add_argument("--out", required=True)
    train = commands.add_parser("train")
    train.add_argument("--config", default="grpo")
    train.add_argument("overrides", nargs="*")
    return parser


def refusal(argv: list[str], capsys: pytest.CaptureFixture[str]) -> list[str]:
    """The stderr lines of a refused command line; the exit status must be argparse's 2."""
    with pytest.raises(SystemExit) as exit_:
        parse(app(), argv)
    assert exit_.value.code == 2
    return capsys.readouterr().err.strip().splitlines()


def test_a_typo_gets_the_subcommand_usage_and_the_close_flag(capsys: pytest.CaptureFixture[str]) -> None:
    lines = refusal(["warmup", "--out", "o", "--max-token-per-micro-batch", "512"], capsys)
    assert lines[0].startswith("usage: app warmup [-h]")
    assert lines[-1] == (
        "app warmup: error: unrecognized arguments: --max-token-per-micro-batch; "
        "did you mean --max-tokens-per-micro-batch?"
    )


def test_garbage_gets_no_guess(capsys: pytest.CaptureFixture[str]) -> None:
    lines = refusal(["warmup", "--xyzzy", "3"], capsys)
    assert lines[-1] == "app warmup: error: unrecognized arguments: --xyzzy"


def test_a_prefix_is_refused_not_taken(capsys: pytest.CaptureFixture[str]) -> None:
    """argparse would take `--epoch 1` as `--epochs 1`; here it is refused, naming the flag it would have been."""
    assert refusal(["warmup", "--epoch", "1"], capsys)[-1] == (
        "app warmup: error: unrecognized arguments: --epoch; did you mean --epochs?"
    )
    assert refusal(["warmup", "--val=x"], capsys)[-1] == (
        "app warmup: error: unrecognized arguments: --val=x; did you mean --val-data?"
    )


def test_several_typos_each_name_their_flag(capsys: pytest.CaptureFixture[str]) -> None:
    assert refusal(["warmup", "--epoch", "1", "--lrr", "2", "--xyzzy"], capsys)[-1] == (
        "app warmup: error: unrecognized arguments: --epoch --lrr --xyzzy; "
        "--epoch: did you mean --epochs?; --lrr: did you mean --lr?"
    )


def test_a_typo_is_named_before_a_missing_required_flag(capsys: pytest.CaptureFixture[str]) -> None:
    """argparse alone reports the missing --out and hides the typo; the typo comes first here."""
    assert refusal(["warmup", "--epoch", "1"], capsys)[-1] == (
        "app warmup: error: unrecognized arguments: --epoch; did you mean --epochs?"
    )
    assert refusal(["warmup", "--epochs", "1"], capsys)[-1] == (
        "app warmup: error: the following arguments are required: --out"
    )


def test_a_leftover_value_is_refused_by_the_subcommand(capsys: pytest.CaptureFixture[str]) -> None:
    assert refusal(["warmup", "--out", "o", "stray"], capsys)[-1] == "app warmup: error: unrecognized arguments: stray"


def test_help_still_wins_over_a_typo(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        parse(app(), ["warmup", "--epoch", "1", "-h"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.startswith("usage: app warmup [-h]")


def test_spelled_out_flags_and_overrides_still_parse() -> None:
    args = parse(app(), ["warmup", "--epochs=3", "--max-tokens-per-micro-batch", "8", "--out", "o"])
    assert (args.epochs, args.max_tokens_per_micro_batch) == (3.0, 8)
    args = parse(app(), ["train", "a.b=1", "--config", "x", "actor.learning_rate=2"])
    assert (args.config, args.overrides) == ("x", ["a.b=1", "actor.learning_rate=2"])


def test_the_command_parser_is_the_chosen_subcommand() -> None:
    parser = app()
    assert command_parser(parser, parse(parser, ["train"])).prog == "app train"
    flat = argparse.ArgumentParser(prog="flat")
    assert command_parser(flat, parse(flat, [])) is flat


def test_rlloom_core_rl_takes_no_prefix(capsys: pytest.CaptureFixture[str]) -> None:
    """`rlloom-core-rl export-hf ... --dt float32` was taken as --dtype; now it is refused naming --dtype."""
    from rlloom.core_rl.cli.main import main

    with pytest.raises(SystemExit) as exit_:
        main(["export-hf", "ckpt", "out", "--dt", "float32"])
    assert exit_.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[0].startswith("usage: rlloom-core-rl export-hf [-h]")
    assert lines[-1] == "rlloom-core-rl export-hf: error: unrecognized arguments: --dt; did you mean --dtype?"
