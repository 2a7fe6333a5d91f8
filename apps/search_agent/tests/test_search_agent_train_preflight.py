"""`search-agent train` checks its config (core-rl's sections and `search:`) before the agent package, torch or
transformers load (issue 41): a typo answers with the right suggestion while `torch` is absent from sys.modules."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

# runs the CLI and reports, at the moment it exits with the error, whether torch or transformers were imported
_CLI = """
import sys
from rlloom_apps.search_agent.cli import main
try:
    main(sys.argv[1:])
except SystemExit as exit:
    print("exit", exit.code, "torch" in sys.modules, "transformers" in sys.modules)
"""


def _train(tmp_path: Path, *overrides: str) -> tuple[str, str]:
    rows = tmp_path / "rows.jsonl"
    row = {"question": "who?", "golden_answers": ["a"], "data_source": "nq"}
    rows.write_text(json.dumps(row) + "\n")
    args = ["train", "--train-data", str(rows), "--index", str(tmp_path), f"model.path={tmp_path}", *overrides]
    command = [sys.executable, "-c", _CLI, *args]
    done = subprocess.run(command, check=False, capture_output=True, text=True, timeout=300)
    return done.stdout.strip(), done.stderr


def test_a_peer_key_typo_answers_with_ours_before_torch_loads(tmp_path: Path) -> None:
    out, err = _train(tmp_path, "actor.learning_rate=1e-6")
    assert "unknown key 'actor.learning_rate'; did you mean 'actor.lr'?" in err
    assert out == "exit 2 False False"


def test_a_search_section_typo_answers_before_torch_loads(tmp_path: Path) -> None:
    out, err = _train(tmp_path, "search.top_kk=3")
    assert "search.top_kk" in err and "top_k" in err
    assert out == "exit 2 False False"
