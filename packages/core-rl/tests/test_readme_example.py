"""README's usage example runs as written after its install line (`rlloom-core-rl rlloom-rollout`; issue 29)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).parents[1] / "README.md"


def test_usage_example_runs(tmp_path: Path) -> None:
    pytest.importorskip("rlloom.rollout", reason="the example's install line adds rlloom-rollout")
    usage = README.read_text(encoding="utf-8").split("## Usage", 1)[1]
    match = re.search(r"```python\n(.*?)```", usage, re.DOTALL)
    assert match is not None, "README's Usage section has no python example"
    assert "pip install rlloom-core-rl rlloom-rollout" in usage.split("```python", 1)[0]
    done = subprocess.run(
        [sys.executable, "-c", match.group(1)], check=False, cwd=tmp_path, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert 0.0 <= float(done.stdout.strip().splitlines()[-1]) <= 1.0  # the last step's mean reward
    assert (tmp_path / "runs" / "demo" / "checkpoints" / "latest").is_file()
