"""Turn public math and code datasets into rows in the veRL shape the trainer and `reasoning eval` read.

A row is `{"data_source", "prompt": [chat messages], "reward_model": {"style": "rule", "ground_truth"},
"extra_info": {...}}`; `data_source` picks the default scorer in rlloom.rewards' registry (the math checker, or
the sandboxed HumanEval / MBPP test harness). Code rows set `extra_info["partial"] = False`: a sample counts as
solved only when every test passes, as pass@k is defined.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rlloom.core_rl.data import DataError, atomic_output, read_jsonl

INSTRUCTION = "Let's think step by step and output the final answer within \\boxed{}."
CODE_INSTRUCTION = "Write the complete function in one ```python code block."

# dataset name -> (question field, answer field); AIME files come with either `problem` or `question`
FIELDS: dict[str, tuple[str, str]] = {
    "gsm8k": ("question", "answer"),
    "math500": ("problem", "answer"),
    "aime24": ("problem", "answer"),
    "aime25": ("question", "answer"),
    "humaneval": ("prompt", "test"),
    "mbpp": ("text", "test_list"),
}
QUESTION_ALTERNATIVES: dict[str, tuple[str, ...]] = {
    "aime24": ("problem", "question"),
    "aime25": ("question", "problem"),
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
        raise DataError(
            f"the GSM8K answer has no '#### <number>' final line ({solution[-80:]!r}); GSM8K answers end with one "
            "(openai/gsm8k main or socratic); is --dataset right for this file?"
        )
    return solution.rsplit("####", 1)[1].strip().replace(",", "")


def to_row(dataset: str, record: dict[str, Any], index: int, split: str) -> dict[str, Any]:
    """Convert one source record; raises with the missing field named."""
    if dataset not in FIELDS:
        raise DataError(f"unknown --dataset {dataset!r}; choose one of {sorted(FIELDS)}")
    if not isinstance(record, dict):
        raise DataError(f"{dataset} record {index} is a JSON {type(record).__name__}, not an object")
    q_key, a_key = FIELDS[dataset]
    alternatives = QUESTION_ALTERNATIVES.get(dataset, (q_key,))
    q_key = next((k for k in alternatives if k in record), q_key)
    for key in (q_key, a_key):
        if key not in record:
            needed = " or ".join(repr(k) for k in alternatives) + f" and {a_key!r}"
            raise DataError(
                f"{dataset} record {index} has no field {key!r}; {dataset} records need {needed} "
                f"(this one has {sorted(record)}); is --dataset right for this file?"
            )
    if dataset == "humaneval":
        return humaneval_row(record, index, split)
    if dataset == "mbpp":
        return mbpp_row(record, index, split)
    question, answer = record[q_key], record[a_key]
    if not isinstance(question, str) or not question.strip():
        raise DataError(
            f"{dataset} record {index} has an empty or non-text {q_key!r} ({question!r}); fix or drop the record"
        )
    # null, true/false or an object would become a gold such as "None" that a model's \boxed{None} matches
    if isinstance(answer, bool) or not isinstance(answer, str | int | float):
        raise DataError(
            f"{dataset} record {index}: its {a_key!r} is not text or a number ({answer!r}); fix or drop the record"
        )
    ground_truth = gsm8k_final_answer(str(answer)) if dataset == "gsm8k" else str(answer).strip()
    if not ground_truth:
        raise DataError(f"{dataset} record {index} has an empty answer ({answer!r}); fix or drop the record")
    return {
        "data_source": dataset,
        "prompt": [{"role": "user", "content": f"{question.strip()} {INSTRUCTION}"}],
        "reward_model": {"style": "rule", "ground_truth": ground_truth},
        "extra_info": {"index": index, "split": split, **_solution(dataset, record)},
    }


def _solution(dataset: str, record: dict[str, Any]) -> dict[str, str]:
    """The dataset's own worked solution, kept for warm-up demonstrations (GSM8K's answer, MATH-500's solution)."""
    text = record.get("answer") if dataset == "gsm8k" else record.get("solution")
    if dataset == "gsm8k" and isinstance(text, str) and "####" in text:
        text = text.rsplit("####", 1)[0]
    return {"solution": text.strip()} if isinstance(text, str) and text.strip() else {}


def humaneval_row(record: dict[str, Any], index: int, split: str) -> dict[str, Any]:
    """The function signature and docstring as the prompt; the harness runs `check(entry_point)` from `test`."""
    if "entry_point" not in record:
        raise DataError(f"humaneval record {index} has no field 'entry_point' (fields: {sorted(record)})")
    for key in ("prompt", "test", "entry_point"):  # a null test would only fail, as a scoring error, at eval time
        if not isinstance(record[key], str) or not record[key].strip():
            raise DataError(f"humaneval record {index} has an empty or non-text {key!r} ({record[key]!r})")
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
    listed = record["test_list"]
    # a bare string would be split into one-character "tests"; null would end in a TypeError
    if not isinstance(listed, list) or not listed or not all(isinstance(t, str) and t.strip() for t in listed):
        raise DataError(f"mbpp record {index}: 'test_list' must be a non-empty list of assert strings, got {listed!r}")
    tests = list(listed)
    if not isinstance(record["text"], str) or not record["text"].strip():
        raise DataError(f"mbpp record {index} has an empty or non-text 'text' ({record['text']!r})")
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


def prepare(dataset: str, source: Path, out: Path, *, split: str = "test", limit: int | None = None) -> int:
    """Write `out` (JSONL) from `source` (JSONL, or `.jsonl.gz`); returns the number of rows written.

    The rows go to a temporary file renamed to `out` at the end, so a failure leaves no partial `out` behind.
    """
    if limit is not None and limit < 0:
        raise DataError(f"--limit must be 0 or more, got {limit}")
    if dataset == "mbpp" and split not in MBPP_SPLITS:
        raise DataError(f"mbpp --split must be one of {sorted(MBPP_SPLITS)} (its task-id ranges), got {split!r}")
    count = 0
    records = read_jsonl(source)
    with atomic_output(out) as handle:
        for index, record in enumerate(records):
            if limit is not None and count >= limit:
                break
            try:
                if dataset == "mbpp" and not _in_mbpp_split(record, index, split):
                    continue
                row = to_row(dataset, record, index, split)
            except DataError as err:
                raise DataError(f"--input {records.where(index)}: {err}") from None  # file:line of the record
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")
            count += 1
    return count


def _in_mbpp_split(record: dict[str, Any], index: int, split: str) -> bool:
    if "task_id" not in record:
        raise DataError(f"mbpp record {index} has no field 'task_id', which picks its split")
    return int(record["task_id"]) in MBPP_SPLITS[split]
