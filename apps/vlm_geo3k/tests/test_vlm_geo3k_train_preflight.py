"""`vlm-geo3k train` checks the config and every row's data_source before torch loads (issue 41)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

_CLI = """
import sys
from rlloom_apps.vlm_geo3k.cli import main
try:
    main(sys.argv[1:])
except SystemExit as exit:
    print("exit", exit.code, "torch" in sys.modules, "transformers" in sys.modules)
"""


def _train(*args: str) -> tuple[str, str]:
    done = subprocess.run(
        [sys.executable, "-c", _CLI, "train", *args], capture_output=True, text=True, timeout=300, check=False
    )
    return done.stdout.strip(), done.stderr


def test_typos_in_the_config_and_in_a_row_answer_before_torch_loads(tmp_path: Path) -> None:
    rows = tmp_path / "rows.jsonl"
    row = {"prompt": "<image>x?", "images": [], "data_source": "geometry3kk", "reward_model": {"ground_truth": "2"}}
    rows.write_text(json.dumps(row) + "\n")
    out, err = _train("--train-data", str(rows), f"model.path={tmp_path}", "rollout.num_generations=8")
    assert "unknown key 'rollout.num_generations'; did you mean 'rollout.n'?" in err
    assert out == "exit 2 False False"
    out, err = _train("--train-data", str(rows), f"model.path={tmp_path}")
    assert f"{rows}:1: data_source 'geometry3kk' is unknown; did you mean 'geometry3k'?" in err
    assert out == "exit 2 False False"
