"""Turn open-domain QA sets into Search-R1 training rows.

The prompt follows Search-R1's `make_prefix` (scripts/data_process/nq_search.py): reason in <think>, search with
<search> query </search>, read <information>, answer in <answer>. Ground truth is `{"target": [aliases]}` as in
Search-R1, so its EM reward and ours read the same rows.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rlloom.agent.envs.search import SEARCH_R1_TEMPLATE  # the prompt SearchEnv itself uses


def search_r1_prompt(question: str) -> str:
    question = question.strip()
    if not question.endswith("?"):
        question += "?"
    return SEARCH_R1_TEMPLATE.format(question=question)


def answers_of(record: dict[str, Any], index: int) -> list[str]:
    """NQ-open stores a list of aliases under `answer`; HotpotQA a single string."""
    answer = record.get("answer", record.get("answers", record.get("golden_answers")))
    if answer is None:
        raise ValueError(f"record {index} has no 'answer', 'answers' or 'golden_answers' field")
    aliases = [answer] if isinstance(answer, str) else [str(a) for a in answer]
    if not aliases or not all(a.strip() for a in aliases):
        raise ValueError(f"record {index} has an empty answer: {answer!r}")
    return aliases


def to_row(data_source: str, record: dict[str, Any], index: int, split: str) -> dict[str, Any]:
    if "question" not in record:
        raise ValueError(f"{data_source} record {index} has no field 'question' (fields: {sorted(record)})")
    return {
        "data_source": data_source,
        "prompt": [{"role": "user", "content": search_r1_prompt(str(record["question"]))}],
        "reward_model": {"style": "rule", "ground_truth": {"target": answers_of(record, index)}},
        "extra_info": {"index": index, "split": split, "question": str(record["question"]).strip()},
    }


def read_records(path: Path) -> Iterator[dict[str, Any]]:
    """JSONL (NQ-open) or a JSON list (HotpotQA's simplified dev file)."""
    text = path.read_text(encoding="utf-8")
    if text.lstrip().startswith("["):
        yield from json.loads(text)
        return
    for line_no, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                yield json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{line_no}: not valid JSON ({err.msg})") from err


def prepare(data_source: str, source: Path, out: Path, *, split: str = "test", limit: int | None = None) -> int:
    out.parent.mkdir(parents=True, exist_ok=True)
    count = 0
    with out.open("w", encoding="utf-8") as handle:
        for index, record in enumerate(read_records(source)):
            if limit is not None and count >= limit:
                break
            handle.write(json.dumps(to_row(data_source, record, index, split), ensure_ascii=False) + "\n")
            count += 1
    return count
