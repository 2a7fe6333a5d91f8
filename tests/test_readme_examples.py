"""Every ```python example in the packages' and apps' READMEs runs as written.

A README is a researcher's first contact; an example that no longer runs is a bug. The blocks of one README run
in order in one namespace (a later block may use what an earlier one defined, as a reader would), in a fresh
working directory holding the files the text names (`corpus.jsonl`, `grpo.yaml`, `diagram.png`, ...), built
here from the repository's test fixtures. A block that cannot run in CI says why on the line before its fence:
`<!-- readme-example: skip, <reason> -->`.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rlloom.rollout.hf.engine import HFEngine

ROOT = Path(__file__).resolve().parents[1]
READMES = sorted([*ROOT.glob("packages/*/README.md"), *ROOT.glob("apps/*/README.md"), ROOT / "README.md"])
FENCE = re.compile(r"^(?:<!-- readme-example: skip, (?P<skip>[^>]+?) -->\n)?```python\n(?P<code>.*?)^```$", re.M | re.S)

Setup = Callable[[Path], dict[str, Any]]


def python_blocks(readme: Path) -> list[tuple[str, str | None]]:
    """(code, skip reason or None) for each ```python block of `readme`, in order."""
    return [(m["code"], m["skip"]) for m in FENCE.finditer(readme.read_text())]


# ------------------------------------------------------------------ what each README's text assumes is there
def _search_corpus(cwd: Path) -> dict[str, Any]:
    shutil.copy(ROOT / "packages/retrieval/tests/data/search_r1_corpus.jsonl", cwd / "corpus.jsonl")
    return {}


def _grpo_run(cwd: Path) -> dict[str, Any]:
    """The core-rl README's `grpo.yaml` (its link: tests/data/tiny_grpo.yaml) and a saved model at ./my-qwen2."""
    from rlloom.core_rl.tiny import char_tokenizer, tiny_qwen2

    shutil.copy(ROOT / "packages/core-rl/tests/data/tiny_grpo.yaml", cwd / "grpo.yaml")
    tok = char_tokenizer()
    tiny_qwen2(tok).save_pretrained(cwd / "my-qwen2")
    tok.save_pretrained(cwd / "my-qwen2")
    return {}


def _vlm_world(cwd: Path) -> dict[str, Any]:
    """`diagram.png`, and the Qwen-VL `tokenizer` and `engine` the second example assumes (tiny, random)."""
    from PIL import Image

    from rlloom.multimodal.tiny import qwen_vl_char_tokenizer, tiny_qwen2_5_vl

    Image.new("RGB", (96, 64), (200, 30, 30)).save(cwd / "diagram.png")
    tokenizer = qwen_vl_char_tokenizer()
    return {"tokenizer": tokenizer, "engine": HFEngine(tiny_qwen2_5_vl(tokenizer), tokenizer)}


SETUP: dict[str, Setup] = {
    "packages/agent/README.md": _search_corpus,
    "packages/core-rl/README.md": _grpo_run,
    "packages/multimodal/README.md": _vlm_world,
}


def test_the_fence_pattern_finds_every_python_block() -> None:
    """The fence pattern finds every ```python block (a miss would silently leave an example untested)."""
    for readme in READMES:
        opened = len(re.findall(r"^```python$", readme.read_text(), re.M))
        assert len(python_blocks(readme)) == opened, f"{readme}: a ```python block the test does not parse"
    assert sum(len(python_blocks(r)) for r in READMES) >= 15


RUNNABLE = [r for r in READMES if any(skip is None for _, skip in python_blocks(r))]


@pytest.mark.parametrize("readme", RUNNABLE, ids=lambda p: str(p.relative_to(ROOT)))
def test_readme_examples_run(readme: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    name = str(readme.relative_to(ROOT))
    namespace: dict[str, Any] = {"__name__": "__readme__", **SETUP.get(name, lambda _: {})(tmp_path)}
    for index, (code, skip) in enumerate(python_blocks(readme)):
        if skip:
            continue
        exec(compile(code, f"{name}[python block {index}]", "exec"), namespace)  # our own docs, not model output
    for value in namespace.values():  # stop the engines' batching threads
        if isinstance(value, HFEngine):
            value.close()
