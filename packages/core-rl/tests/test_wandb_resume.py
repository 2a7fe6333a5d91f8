"""A resumed run continues the same W&B run: the id is kept in the run folder and passed with resume="allow".

wandb is an optional extra and the test machines have no network, so a stand-in module records `wandb.init`'s
arguments (a test double for the external service; the real client's id/resume contract is W&B's documented one).
"""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from rlloom.core_rl.observe.trackers import WANDB_ID_FILE, WandbTracker


class _Run:
    def __init__(self) -> None:
        self.config = types.SimpleNamespace(update=lambda *a, **k: None)
        self.finished = False

    def log(self, *args: Any, **kwargs: Any) -> None:
        pass

    def finish(self) -> None:
        self.finished = True


@pytest.fixture
def fake_wandb(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    calls: list[dict[str, Any]] = []
    module = types.ModuleType("wandb")

    def init(**kwargs: Any) -> _Run:
        calls.append(kwargs)
        return _Run()

    module.init = init  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "wandb", module)
    return calls


def test_a_resumed_folder_reuses_its_wandb_run_id(tmp_path: Path, fake_wandb: list[dict[str, Any]]) -> None:
    first = WandbTracker("proj", "run-a", tmp_path, {"a": 1})
    first.close()
    second = WandbTracker("proj", "run-a", tmp_path, {"a": 1})
    second.close()
    one, two = fake_wandb
    assert re.fullmatch(r"[a-z0-9]{8}", one["id"])
    assert two["id"] == one["id"]
    assert one["resume"] == two["resume"] == "allow"
    assert (tmp_path / WANDB_ID_FILE).read_text(encoding="utf-8").strip() == one["id"]


def test_another_run_folder_gets_another_id(tmp_path: Path, fake_wandb: list[dict[str, Any]]) -> None:
    WandbTracker("proj", "a", tmp_path / "a", {}).close()
    WandbTracker("proj", "b", tmp_path / "b", {}).close()
    assert fake_wandb[0]["id"] != fake_wandb[1]["id"]
