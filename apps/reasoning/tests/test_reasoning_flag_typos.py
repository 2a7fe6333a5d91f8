"""`reasoning` refuses a mistyped flag under the subcommand's usage line with the flag it meant, refuses a prefix
(`--epoch`) instead of taking it, shows a bad settings value under the subcommand's usage too, and answers a
typo without loading torch. Expected lines are written from the warm-up's documented flags."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from rlloom_apps.reasoning.cli import main

WARMUP = ["warmup", "--model", "m", "--train-data", "t", "--out", "o"]


def refusal(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[str, str]:
    """The usage line and the error line of a refused command; the exit status is argparse's 2."""
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    return lines[0], lines[-1]


def test_a_typo_names_the_flag_under_the_warmup_usage(capsys: pytest.CaptureFixture[str]) -> None:
    usage, error = refusal([*WARMUP, "--max-token-per-micro-batch", "512"], capsys)
    assert usage.startswith("usage: reasoning warmup [-h] --model MODEL")
    assert error == (
        "reasoning warmup: error: unrecognized arguments: --max-token-per-micro-batch; "
        "did you mean --max-tokens-per-micro-batch?"
    )
    without_out = ["warmup", "--model", "x", "--train-data", "y", "--max-token-per-micro-batch", "1"]
    assert refusal(without_out, capsys)[1] == error  # the typo before the missing --out
    assert refusal([*WARMUP, "--xyzzy", "3"], capsys)[1] == "reasoning warmup: error: unrecognized arguments: --xyzzy"


def test_a_prefix_is_refused_not_taken_for_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    assert refusal([*WARMUP, "--epoch", "1"], capsys)[1] == (
        "reasoning warmup: error: unrecognized arguments: --epoch; did you mean --epochs?"
    )


def test_a_bad_settings_value_shows_the_warmup_usage(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    usage, error = refusal(
        ["warmup", "--model", str(tmp_path), "--train-data", "t", "--out", str(tmp_path / "o"),
         "--max-tokens-per-micro-batch", "0"],
        capsys,
    )  # fmt: skip
    assert usage.startswith("usage: reasoning warmup [-h]")
    assert error == (
        "reasoning warmup: error: --max-tokens-per-micro-batch 0: input should be greater than or equal to 1"
    )


def test_other_subcommands_show_their_own_usage(capsys: pytest.CaptureFixture[str]) -> None:
    usage, error = refusal(["train", "--train-data", "t", "--confg", "grpo", "actor.lr=1"], capsys)
    assert usage.startswith("usage: reasoning train [-h]")
    assert error.startswith("reasoning train: error: unrecognized arguments: --confg") and error.endswith(
        "; did you mean --config?"
    )


def test_a_typo_is_answered_without_torch() -> None:
    code = (
        "import sys\nfrom rlloom_apps.reasoning.cli import main\n"
        f"try:\n    main({[*WARMUP, '--max-token-per-micro-batch', '1']!r})\n"
        "except SystemExit as e:\n    assert e.code == 2, e.code\n"
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert done.stdout.strip() == "[]"
    assert "did you mean --max-tokens-per-micro-batch?" in done.stderr
