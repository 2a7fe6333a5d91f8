"""`reasoning train` checks the config, the data files and every row's data_source before torch loads (issue 41):
the error comes with the right suggestion while `torch` is still absent from sys.modules."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from rlloom_apps.reasoning.preflight import check_rows

from rlloom.core_rl.config import ConfigError

# runs the CLI and reports, at the moment it exits with the error, whether torch or transformers were imported
_CLI = """
import sys
from rlloom_apps.reasoning.cli import main
try:
    main(sys.argv[1:])
except SystemExit as exit:
    print("exit", exit.code, "torch" in sys.modules, "transformers" in sys.modules)
"""


def _rows(path: Path, *sources: str | None) -> Path:
    rows = [{"prompt": [{"role": "user", "content": "1+1?"}], "reward_model": {"ground_truth": "2"}} for _ in sources]
    for row, source in zip(rows, sources, strict=True):
        if source is not None:
            row["data_source"] = source
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def _train(*args: str) -> tuple[str, str]:
    done = subprocess.run(
        [sys.executable, "-c", _CLI, "train", *args], capture_output=True, text=True, timeout=300, check=False
    )
    return done.stdout.strip(), done.stderr


def test_a_peer_name_typed_for_a_key_answers_with_ours_before_torch_loads(tmp_path: Path) -> None:
    rows = _rows(tmp_path / "rows.jsonl", "openai/gsm8k")
    out, err = _train("--train-data", str(rows), f"model.path={tmp_path}", "actor.learning_rate=1e-6")
    assert "unknown key 'actor.learning_rate'; did you mean 'actor.lr'?" in err
    assert out == "exit 2 False False"


def test_a_data_source_typo_answers_with_the_nearest_scorer_before_torch_loads(tmp_path: Path) -> None:
    rows = _rows(tmp_path / "rows.jsonl", "openai/gsm8k", "openai/gsm8kk")
    out, err = _train("--train-data", str(rows), f"model.path={tmp_path}")
    assert f"{rows}:2: data_source 'openai/gsm8kk' is unknown; did you mean 'gsm8k'?" in err
    assert out == "exit 2 False False"


def test_rows_of_known_sources_pass_and_each_problem_names_its_file_and_line(tmp_path: Path) -> None:
    good = _rows(tmp_path / "good.jsonl", "openai/gsm8k", "math500", "searchR1_nq", "my_scorers:score")
    check_rows(good, None)
    bad = _rows(tmp_path / "bad.jsonl", "gsm8k", None, "mathh", "mathh")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(ConfigError) as caught:
        check_rows(bad, empty)
    lines = str(caught.value).splitlines()
    assert lines[0] == f"{bad}:2: the row has no data_source, which picks its scorer"
    assert lines[1].startswith(f"{bad}:3: data_source 'mathh' is unknown; did you mean 'math'?")
    assert lines[2] == f"--val-data {empty} holds no rows; give rows from `reasoning prepare-data`"
    assert len(lines) == 3  # one line per distinct unknown name
