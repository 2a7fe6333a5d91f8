"""Turn public math datasets into training rows in the veRL shape the trainer reads.

A row is `{"data_source", "prompt": [chat messages], "reward_model": {"style": "rule", "ground_truth"},
"extra_info": {...}}`; `data_source` picks the default scorer in rlloom.rewards' registry.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

INSTRUCTION = "Let's think step by step and output the final answer within \\boxed{}."

# dataset name -> (question field, answer field)
FIELDS: dict[str, tuple[str, str]] = {
    "gsm8k": ("question", "answer"),
    "math500": ("problem", "answer"),
    "aime24": ("problem", "answer"),
    "aime25": ("question", "answer"),
}


def gsm8k_final_answer(solution: str) -> str:
    """GSM8K solutions end with `#### <number>`; the number (without thousands commas) is the ground truth."""
    if "####" not in solution:
        raise ValueError(f"GSM8K solution has no '#### answer' line: {solution[-80:]!r}")
    return solution.rsplit("####", 1)[1].strip().replace(",", "")


def to_row(dataset: str, record: dict[str, Any], index: int, split: str) -> dict[str, Any]:
    """Convert one source record; raises with the missing field named."""
    if dataset not in FIELDS:
        raise ValueError(f"unknown dataset {dataset!r}; choose one of {sorted(FIELDS)}")
    q_key, a_key = FIELDS[dataset]
    for key in (q_key, a_key):
        if key not in record:
            raise ValueError(f"{dataset} record {index} has no field {key!r} (fields: {sorted(record)})")
    answer = str(record[a_key])
    ground_truth = gsm8k_final_answer(answer) if dataset == "gsm8k" else answer.strip()
    return {
        "data_source": dataset,
        "prompt": [{"role": "user", "content": f"{str(record[q_key]).strip()} {INSTRUCTION}"}],
        "reward_model": {"style": "rule", "ground_truth": ground_truth},
        "extra_info": {"index": index, "split": split},
    }


def read_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    with path.open(encoding="utf-8") as handle:
        for line_no, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                yield json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{line_no}: not valid JSON ({err.msg})") from err


def prepare(dataset: str, source: Path, out: Path, *, split: str = "test", limit: int | None = None) -> int:
    """Write `out` (JSONL) from `source`; returns the number of rows written."""
    out.parent.mkdir(parents=True, exist_ok=True)
    count = 0
    with out.open("w", encoding="utf-8") as handle:
        for index, record in enumerate(read_jsonl(source)):
            if limit is not None and count >= limit:
                break
            handle.write(json.dumps(to_row(dataset, record, index, split), ensure_ascii=False) + "\n")
            count += 1
    return count
