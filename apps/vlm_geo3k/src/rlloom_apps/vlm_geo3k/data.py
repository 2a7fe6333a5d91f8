"""Turn Geometry3K problem folders (data.json + img_diagram.png) into VLM training rows.

Rows follow EasyR1's layout: the prompt starts with a literal `<image>` marker where the diagram goes, `images`
lists the diagram's path, and the ground truth accepts both the choice's value and its letter.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# EasyR1:examples/format_prompt/math.jinja, which its math reward's format check expects
INSTRUCTION = (
    "You FIRST think about the reasoning process as an internal monologue and then provide the final answer. "
    "The reasoning process MUST BE enclosed within <think> </think> tags. The final answer MUST BE put in \\boxed{}."
)
LETTERS = "ABCD"


def to_row(problem_dir: Path, split: str) -> dict[str, Any]:
    data_file, image = problem_dir / "data.json", problem_dir / "img_diagram.png"
    for required in (data_file, image):
        if not required.is_file():
            raise FileNotFoundError(f"Geometry3K problem folder {problem_dir} lacks {required.name}")
    record = json.loads(data_file.read_text(encoding="utf-8"))
    choices = [str(c) for c in record.get("choices", [])]
    letter = str(record.get("answer", "")).strip()
    if len(choices) != len(LETTERS) or letter not in LETTERS:
        raise ValueError(f"{data_file}: expected 4 choices and an answer letter A-D, got {choices} / {letter!r}")
    value = choices[LETTERS.index(letter)]
    listed = " ".join(f"{tag}. {choice}" for tag, choice in zip(LETTERS, choices, strict=True))
    return {
        "data_source": "geometry3k",
        "prompt": [{"role": "user", "content": f"<image>{record['problem_text']}\nChoices: {listed}\n{INSTRUCTION}"}],
        "images": [str(image.resolve())],
        "reward_model": {"style": "rule", "ground_truth": [value, letter]},
        "extra_info": {"id": record.get("id", problem_dir.name), "split": split, "choices": choices},
    }


def prepare(source: Path, out: Path, *, split: str = "train") -> int:
    """Convert every problem folder under `source` (sorted by numeric id) into one JSONL file."""
    folders = sorted((p for p in source.iterdir() if (p / "data.json").is_file()), key=lambda p: (len(p.name), p.name))
    if not folders:
        raise FileNotFoundError(f"no Geometry3K problem folders (with data.json) under {source}")
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", encoding="utf-8") as handle:
        for folder in folders:
            handle.write(json.dumps(to_row(folder, split), ensure_ascii=False) + "\n")
    return len(folders)
