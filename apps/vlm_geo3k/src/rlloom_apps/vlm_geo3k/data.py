"""Turn Geometry3K problem folders (data.json + img_diagram.png) into VLM training rows.

Rows follow EasyR1's layout: the prompt starts with a literal `<image>` marker where the diagram goes, `images`
lists the diagram's path, and the ground truth accepts both the choice's value and its letter.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rlloom.core_rl.data import DataError, write_jsonl
from rlloom.multimodal import load_image

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
            raise DataError(f"Geometry3K problem folder {problem_dir} lacks {required.name}")
    try:
        record = json.loads(data_file.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise DataError(f"{data_file}:{err.lineno}: not valid JSON ({err.msg})") from None
    if not isinstance(record, dict) or "problem_text" not in record:
        raise DataError(f"{data_file}: expected an object with problem_text, choices and answer")
    if not isinstance(record["problem_text"], str) or not record["problem_text"].strip():
        raise DataError(f"{data_file}: problem_text is empty or not text ({record['problem_text']!r})")
    listed = record.get("choices")
    # null choices would end in a TypeError, a null choice would become the gold "None"
    texts = isinstance(listed, list) and all(isinstance(c, str | int | float) for c in listed)
    choices = [str(c) for c in listed] if isinstance(listed, list) and texts else []
    letter = str(record.get("answer", "")).strip()
    if len(choices) != len(LETTERS) or letter not in LETTERS or not all(c.strip() for c in choices):
        raise DataError(f"{data_file}: expected 4 choices and an answer letter A-D, got {listed!r} / {letter!r}")
    try:  # a file that is not a picture would otherwise fail only when training or eval loads it
        load_image(image)
    except (ValueError, OSError) as err:
        raise DataError(f"{image}: not a readable image ({err})") from None
    value = choices[LETTERS.index(letter)]
    listed = " ".join(f"{tag}. {choice}" for tag, choice in zip(LETTERS, choices, strict=True))
    return {
        "data_source": "geometry3k",
        "prompt": [{"role": "user", "content": f"<image>{record['problem_text']}\nChoices: {listed}\n{INSTRUCTION}"}],
        "images": [str(image.resolve())],
        "reward_model": {"style": "rule", "ground_truth": [value, letter]},
        "extra_info": {"id": record.get("id", problem_dir.name), "split": split, "choices": choices},
    }


def check_image_paths(rows: list[dict[str, Any]], label: str) -> None:
    """Refuse, before a model loads, a row whose image path does not exist (the problem folders moved after
    prepare-data); data URIs, bytes and PIL images are left to the loader."""
    for i, row in enumerate(rows):
        images = row.get("images") or []
        for image in [images] if isinstance(images, str) else images:
            if isinstance(image, str) and not image.startswith("data:") and not Path(image).is_file():
                raise DataError(
                    f"{label} row {i}: image {image} does not exist; rerun `vlm-geo3k prepare-data` where the "
                    "problem folders now are"
                )


def prepare(source: Path, out: Path, *, split: str = "train") -> int:
    """Convert every problem folder under `source` (sorted by numeric id) into one JSONL file.

    The rows go to a temporary file renamed to `out` at the end, so a failure leaves no partial `out` behind.
    """
    if (source / "data.json").is_file():
        raise DataError(
            f"--input {source} is one problem folder; give the folder that holds the problem folders "
            f"(e.g. {source.parent})"
        )
    folders = sorted((p for p in source.iterdir() if (p / "data.json").is_file()), key=lambda p: (len(p.name), p.name))
    if not folders:
        raise DataError(
            f"--input {source} holds no Geometry3K problem folders (subfolders with data.json and "
            "img_diagram.png); give e.g. geometry3k/train"
        )
    rows = [to_row(folder, split) for folder in folders]  # every folder checked before anything is written
    return write_jsonl(out, rows)
