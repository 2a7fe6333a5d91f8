"""`reasoning`'s command line: overrides anywhere among the options, every flag described, mistakes named."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
from rlloom_apps.reasoning.cli import build_parser, main, parse


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(action.choices)


@pytest.mark.parametrize(
    ("argv", "overrides"),
    [
        (["train", "model.path=tiny/model", "--train-data", "rows.jsonl", "trainer.total_steps=1"],
         ["model.path=tiny/model", "trainer.total_steps=1"]),
        (["train", "--train-data", "rows.jsonl", "a.b=1", "--config", "dapo", "c.d=2", "e.f=3"],
         ["a.b=1", "c.d=2", "e.f=3"]),
        (["demo", "actor.lr=5e-4", "--steps", "2", "rollout.n=4"], ["actor.lr=5e-4", "rollout.n=4"]),
    ],
)  # fmt: skip
def test_overrides_are_taken_anywhere_among_the_options(argv: list[str], overrides: list[str]) -> None:
    parser = build_parser()
    assert parse(parser, argv).overrides == overrides


def test_other_stray_arguments_are_still_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse(build_parser(), ["train", "--train-data", "x.jsonl", "a.b=1", "--bogus", "c.d=2"])
    assert "unrecognized arguments: --bogus" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse(build_parser(), ["eval", "--data", "x.jsonl", "--limit", "1", "a.b=1"])  # eval takes no overrides


def test_every_flag_is_described_with_its_default() -> None:
    parser = build_parser()
    assert "code" in (parser.description or "") and "HumanEval" in (parser.description or "")
    for name, sub in subcommands(parser).items():
        for action in sub._actions:
            if action.dest != "help":
                assert action.help, f"{name} {action.option_strings or action.dest} has no help"
        text = sub.format_help()
        assert "(default: None)" not in text
    train_help = " ".join(subcommands(parser)["train"].format_help().split())
    assert "or a YAML file (default: grpo)" in train_help
    assert "(default: 0.6)" in " ".join(subcommands(parser)["eval"].format_help().split())  # --temperature


def test_greedy_with_several_samples_is_warned_and_scoring_errors_are_loud(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from rlloom.core_rl.tiny import save_tiny_model

    saved = save_tiny_model(tmp_path / "tiny")
    row = {"data_source": "no_such_set", "prompt": [{"role": "user", "content": "1+1?"}],
           "reward_model": {"ground_truth": "2"}}  # fmt: skip
    data = tmp_path / "rows.jsonl"
    data.write_text(json.dumps(row) + "\n")
    model, tokenizer = str(saved.model), str(saved.tokenizer)
    main(["eval", "--data", str(data), "--model", model, "--tokenizer", tokenizer, "--device", "cpu",
          "--n", "2", "--temperature", "0", "--max-tokens", "4", "--score-workers", "0"])  # fmt: skip
    err = capsys.readouterr().err
    assert "--temperature 0 is greedy: the --n 2 samples of a problem are identical" in err
    assert "WARNING: 2 of 2 samples had scoring errors" in err and "no_such_set" in err


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--n", "0"], "--n 0: input should be greater than or equal to 1"),
        (["--top-p", "1.5"], "--top-p 1.5: input should be less than or equal to 1"),
        (["--limit", "-1"], "--limit must be 0 or more"),
    ],
)
def test_bad_eval_flags_are_named(
    flags: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "rows.jsonl"
    data.write_text("{}\n")
    with pytest.raises(SystemExit) as exit_info:
        main(["eval", "--data", str(data), "--model", str(tmp_path), *flags])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "pydantic.dev" not in err and "Traceback" not in err


def test_a_yaml_config_with_a_syntax_error_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "mine.yaml"
    config.write_text("actor:\n  lr: [1e-6\n")
    data = tmp_path / "rows.jsonl"
    data.write_text("{}\n")
    with pytest.raises(SystemExit):
        main(["train", "--config", str(config), "--train-data", str(data)])
    assert f"--config {config}:" in capsys.readouterr().err
