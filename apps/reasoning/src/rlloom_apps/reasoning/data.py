"""Turn public math and code datasets into rows in the veRL shape the trainer and `reasoning eval` read.

A row is `{"data_source", "prompt": [chat messages], "reward_model": {"style": "rule", "ground_truth"},
"extra_info": {...}}`; `data_source` picks the default scorer in rlloom.rewards' registry (the math checker, or
the sandboxed HumanEval / MBPP test harness). Code rows set `extra_info["partial"] = False`: a sample counts as
solved only when every test passes, as pass@k is defined.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

INSTRUCTION = "Let's think step by step and output the final answer within \\boxed{}."
CODE_INSTRUCTION = "Write the complete function in one ```python code block."

# dataset name -> (question field, answer field)
FIELDS: dict[str, tuple[str, str]] = {
    "gsm8k": ("question", "answer"),
    "math500": ("problem", "answer"),
    "aime24": ("problem", "answer"),
    "aime25": ("question", "answer"),
    "humaneval": ("prompt", "test"),
    "mbpp": ("text", "test_list"),
}

# MBPP's task-id ranges per split (Austin et al. 2021: 1-10 few-shot prompts, 11-510 test, 511-600 validation)
MBPP_SPLITS: dict[str, range] = {
    "prompt": range(1, 11),
    "test": range(11, 511),
    "validation": range(511, 601),
    "train": range(601, 975),
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
    if dataset == "humaneval":
        return humaneval_row(record, index, split)
    if dataset == "mbpp":
        return mbpp_row(record, index, split)
    answer = str(record[a_key])
    ground_truth = gsm8k_final_answer(answer) if dataset == "gsm8k" else answer.strip()
    return {
        "data_source": dataset,
        "prompt": [{"role": "user", "content": f"{str(record[q_key]).strip()} {INSTRUCTION}"}],
        "reward_model": {"style": "rule", "ground_truth": ground_truth},
        "extra_info": {"index": index, "split": split},
    }


def humaneval_row(record: dict[str, Any], index: int, split: str) -> dict[str, Any]:
    """The function signature and docstring as the prompt; the harness runs `check(entry_point)` from `test`."""
    if "entry_point" not in record:
        raise ValueError(f"humaneval record {index} has no field 'entry_point' (fields: {sorted(record)})")
    prompt = str(record["prompt"])
    content = f"Complete the following Python function.\n\n```python\n{prompt}```\n\n{CODE_INSTRUCTION}"
    return {
        "data_source": "humaneval",
        "prompt": [{"role": "user", "content": content}],
        "reward_model": {
            "style": "rule",
            "ground_truth": {"test": record["test"], "entry_point": record["entry_point"]},
        },
        "extra_info": {
            "index": index,
            "split": split,
            "task_id": record.get("task_id", index),
            "prompt": prompt,  # the scorer puts imports and helpers of the prompt in front of the answer
            "partial": False,
        },
    }


def mbpp_row(record: dict[str, Any], index: int, split: str) -> dict[str, Any]:
    """MBPP's standard prompt (the task and its three asserts, which fix the function's name and arguments)."""
    tests = [str(t) for t in record["test_list"]]
    content = (
        f"You are an expert Python programmer, and here is your task: {str(record['text']).strip()} "
        "Your code should pass these tests:\n\n" + "\n".join(tests) + f"\n\n{CODE_INSTRUCTION}"
    )
    truth = {"test_list": tests, "test_setup_code": str(record.get("test_setup_code") or "")}
    return {
        "data_source": "mbpp",
        "prompt": [{"role": "user", "content": content}],
        "reward_model": {"style": "rule", "ground_truth": truth},
        "extra_info": {"index": index, "split": split, "task_id": record.get("task_id", index), "partial": False},
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
            if dataset == "mbpp" and not _in_mbpp_split(record, index, split):
                continue
            handle.write(json.dumps(to_row(dataset, record, index, split), ensure_ascii=False) + "\n")
            count += 1
    return count


def _in_mbpp_split(record: dict[str, Any], index: int, split: str) -> bool:
    if split not in MBPP_SPLITS:
        raise ValueError(f"mbpp --split must be one of {sorted(MBPP_SPLITS)} (its task-id ranges), got {split!r}")
    if "task_id" not in record:
        raise ValueError(f"mbpp record {index} has no field 'task_id', which picks its split")
    return int(record["task_id"]) in MBPP_SPLITS[split]
