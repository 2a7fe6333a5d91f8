"""`search-agent warmup` refuses a mistyped flag and a bad settings value under its own usage line, a typo with the
flag it meant (core-rl's `parse`; the words are tested there, the wiring here)."""

from __future__ import annotations

from pathlib import Path

import pytest
from rlloom_apps.search_agent.cli import main


def refusal(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[str, str]:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    return lines[0], lines[-1]


def test_warmup_typos_and_values_show_the_warmup_usage(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    warmup = ["warmup", "--model", str(tmp_path), "--train-data", "t", "--out", str(tmp_path / "o"), "--index", "i"]
    usage, error = refusal([*warmup, "--max-token-per-micro-batch", "512"], capsys)
    assert usage.startswith("usage: search-agent warmup [-h] --model MODEL")
    assert error == (
        "search-agent warmup: error: unrecognized arguments: --max-token-per-micro-batch; "
        "did you mean --max-tokens-per-micro-batch?"
    )
    usage, error = refusal([*warmup, "--max-tokens-per-micro-batch", "0"], capsys)
    assert usage.startswith("usage: search-agent warmup [-h]")
    assert error == (
        "search-agent warmup: error: --max-tokens-per-micro-batch 0: input should be greater than or equal to 1"
    )
