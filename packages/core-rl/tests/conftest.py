"""Shared fixtures: the tiny model saved as an HF directory, and the test engine/reward module."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # tiny_run.py is also a subprocess script, so a plain module


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tiny_run import make_model_dir

    return make_model_dir(tmp_path_factory.mktemp("tiny_model"))
