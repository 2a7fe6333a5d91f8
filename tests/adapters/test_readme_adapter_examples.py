"""The README examples that need a peer library (marked `readme-example: skip, needs verifiers ...`, so the
`docs` session skips them) run here, where the peers are installed; each block must also do what it says."""

from __future__ import annotations

import json
import re
import sys
import types
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
FENCE = re.compile(r"^<!-- readme-example: skip, (?P<skip>[^>]+?) -->\n```python\n(?P<code>.*?)^```$", re.M | re.S)


def peer_blocks(readme: str) -> list[str]:
    text = (ROOT / readme).read_text()
    return [m["code"] for m in FENCE.finditer(text) if m["skip"].startswith("needs verifiers")]


def run(code: str, name: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Run `code` as a module, as a reader's script would be (pydantic resolves annotations through it)."""
    module = types.ModuleType("readme_example")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    exec(compile(code, name, "exec"), module.__dict__)  # our own docs
    return module.__dict__


def test_rewards_readme_verifiers_example(monkeypatch: pytest.MonkeyPatch) -> None:
    (code,) = peer_blocks("packages/rewards/README.md")
    ns = run(code, "packages/rewards/README.md[verifiers]", monkeypatch)
    assert [fn.__name__ for fn in ns["MathTask"](ns["MathData"](idx=0, answer="4")).hooks("reward")] == ["accuracy"]
    task = ns["MathTask"](ns["MathData"](idx=0, answer="4"), ns["plugged"])
    assert sorted(fn.__name__ for fn in task.hooks("reward")) == ["accuracy", "routed"]


def test_retrieval_readme_verifiers_example(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "corpus.jsonl").write_text(json.dumps({"id": "0", "contents": '"T"\ntext'}) + "\n")
    (code,) = peer_blocks("packages/retrieval/README.md")
    ns = run(code, "packages/retrieval/README.md[verifiers]", monkeypatch)
    (toolset,) = ns["SearchTask"].toolsets(ns["SearchTaskConfig"]())
    assert toolset.server_name == "retrieval" and toolset.config.corpus == "corpus.jsonl"
