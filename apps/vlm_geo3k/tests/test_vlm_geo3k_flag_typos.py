"""`vlm-geo3k train` refuses a mistyped flag under its own usage line with the flag it meant, and a prefix of a
flag instead of taking it (core-rl's `parse`; the words are tested there, the wiring here)."""

from __future__ import annotations

import pytest
from rlloom_apps.vlm_geo3k.cli import main


def test_train_typos_show_the_train_usage(capsys: pytest.CaptureFixture[str]) -> None:
    for typo, meant in (("--confg", "--config"), ("--score-timout", "--score-timeout"), ("--val", "--val-data")):
        with pytest.raises(SystemExit) as exit_:
            main(["train", "--train-data", "t", typo, "x"])
        assert exit_.value.code == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert lines[0].startswith("usage: vlm-geo3k train [-h]")
        assert lines[-1].startswith(f"vlm-geo3k train: error: unrecognized arguments: {typo}")
        assert lines[-1].endswith(f"; did you mean {meant}?")
