"""Turn open-domain QA sets into Search-R1 training rows.

The prompt follows Search-R1's `make_prefix` (scripts/data_process/nq_search.py): reason in <think>, search with
<search> query </search>, read <information>, answer in <answer>. Ground truth is `{"target": [aliases]}` as in
Search-R1, so its EM reward and ours read the same rows.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rlloom.core_rl.data import PARQUET_HINT, DataError, open_text, read_parquet, write_jsonl


def search_r1_question(question: str) -> str:
    """The question as Search-R1's data scripts put it in every prompt: stripped, ending in "?"."""
    question = question.strip()
    if not question.endswith("?"):
        question += "?"
    return question


def search_r1_prompt(question: str) -> str:
    from rlloom.agent.envs.search import SEARCH_R1_TEMPLATE  # the prompt SearchEnv uses (loads torch: here)

    return SEARCH_R1_TEMPLATE.format(question=search_r1_question(question))


def question_of(record: dict[str, Any], index: int, data_source: str) -> str:
    """NQ-open and HotpotQA: `question`; IRCoT: `question_text`; BEIR queries.jsonl: `text` (with `_id`)."""
    found: str | None = None
    for key in ("question", "question_text"):
        if isinstance(record.get(key), str):
            found = str(record[key])
            break
    if found is None and "_id" in record and isinstance(record.get("text"), str):
        found = str(record["text"])
    if found is None:
        already = " (it looks like a prepared row: give the raw QA file)" if "reward_model" in record else ""
        raise DataError(
            f"{data_source} record {index} has no question: expected 'question' (NQ-open, HotpotQA), "
            f"'question_text' (IRCoT) or '_id' + 'text' (BEIR queries); it has {sorted(record)}{already}"
        )
    if not found.strip():
        raise DataError(f"{data_source} record {index} has an empty question; fix or remove the record")
    return found


def answers_of(record: dict[str, Any], index: int) -> list[str]:
    """NQ-open stores a list of aliases under `answer`; HotpotQA a single string; BEIR queries
    `metadata.answers`; IRCoT `answers_objects[].spans`. A number is taken as its text; null, true/false or an
    object as an alias is refused (it would become a gold such as "None" that a model could match)."""
    answer = next(
        (record[k] for k in ("answer", "answers", "golden_answers") if record.get(k) is not None), None
    )  # the first present and non-null, so `"answer": null, "answers": [...]` reads the list
    metadata = record.get("metadata")
    if answer is None and isinstance(metadata, dict):
        answer = metadata.get("answers", metadata.get("answer"))
    if answer is None and isinstance(record.get("answers_objects"), list):
        answer = [span for obj in record["answers_objects"] if isinstance(obj, dict) for span in obj.get("spans", [])]
    if answer is None:
        raise DataError(
            f"record {index} has no answer: expected 'answer', 'answers', 'golden_answers', 'metadata.answers' "
            f"(BEIR queries) or 'answers_objects' (IRCoT); it has {sorted(record)}"
        )
    listed = answer if isinstance(answer, list | tuple) else [answer]
    bad = [a for a in listed if isinstance(a, bool) or not isinstance(a, str | int | float)]
    if bad:
        raise DataError(
            f"record {index} has an answer that is not text or a number: {answer!r}; each gold alias must be a "
            "string (a list of strings for several aliases)"
        )
    aliases = [a if isinstance(a, str) else _number_text(a) for a in listed]
    if not aliases or not all(a.strip() for a in aliases):
        raise DataError(f"record {index} has an empty answer: {answer!r}")
    return aliases


def _number_text(value: int | float) -> str:
    """1972 -> "1972", 3.0 -> "3" (the way the number is written in text), 2.5 -> "2.5"."""
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)


def to_row(data_source: str, record: dict[str, Any], index: int, split: str) -> dict[str, Any]:
    if not isinstance(record, dict):
        raise DataError(f"{data_source} record {index} is a JSON {type(record).__name__}, not an object")
    question = question_of(record, index, data_source).strip()
    return {
        "data_source": data_source,
        "prompt": [{"role": "user", "content": search_r1_prompt(question)}],
        "reward_model": {"style": "rule", "ground_truth": {"target": answers_of(record, index)}},
        "extra_info": {"index": index, "split": split, "question": question},
    }


def read_records(path: Path) -> Iterator[dict[str, Any]]:
    """JSONL (NQ-open; `.gz` too), a JSON list (HotpotQA's simplified dev file), or parquet (Search-R1's
    train.parquet/test.parquet, FlashRAG's files; needs pyarrow).

    A file that is not UTF-8 text and not named *.parquet raises a `DataError` naming the file and what to give
    (it was a bare decoder error, or a traceback in `eval`).
    """
    if path.suffix == ".parquet":
        yield from read_parquet(path)
        return
    try:
        with open_text(path) as handle:
            text = handle.read()
    except (UnicodeDecodeError, gzip.BadGzipFile, EOFError) as err:
        raise DataError(f"{path}: not UTF-8 JSONL or JSON text ({err}); {PARQUET_HINT}") from None
    if text.lstrip().startswith("["):
        try:
            records = json.loads(text)
        except json.JSONDecodeError as err:
            raise DataError(f"{path}:{err.lineno}: not valid JSON ({err.msg})") from None
        yield from records
        return
    for line_no, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                yield json.loads(line)
            except json.JSONDecodeError as err:
                raise DataError(f"{path}:{line_no}: not valid JSON ({err.msg}); give JSONL or a JSON list") from None


def read_rows(path: Path, flag: str, *, as_samples: bool = True) -> list[dict[str, Any]]:
    """The rows of a prepare-data file, each checked for a data source and a gold answer before anything loads;
    `as_samples=False` skips reading each as the agent loop does (that loads torch: `train --dry-run` skips it)."""
    from rlloom.rewards.qa import qa_golds

    if not path.is_file():
        raise DataError(f"{flag} {path} does not exist (make rows with `search-agent prepare-data`)")
    rows = list(read_records(path))
    for i, row in enumerate(rows):
        if not isinstance(row, dict) or "data_source" not in row or "reward_model" not in row:
            raise DataError(
                f"{flag} {path} row {i} is not a prepare-data row (needs data_source, reward_model); "
                "make rows with `search-agent prepare-data`"
            )
        try:
            qa_golds(row["reward_model"].get("ground_truth"))
        except (AttributeError, TypeError, ValueError) as err:
            raise DataError(f"{flag} {path} row {i}: bad reward_model.ground_truth ({err})") from None
        prompt = row.get("prompt", row.get("question"))
        if not (isinstance(prompt, str) and prompt.strip()) and not (isinstance(prompt, list) and prompt):
            raise DataError(
                f"{flag} {path} row {i} has no prompt (a 'prompt' list of chat messages, or a 'question'); "
                "make rows with `search-agent prepare-data`"
            )
        if not as_samples:
            continue
        from rlloom.agent.environment import Sample

        try:  # as the agent loop reads it: a string `prompt` passed here and failed at its first rollout
            Sample.from_row(row)
        except ValueError as err:
            raise DataError(f"{flag} {path} row {i}: {err}") from None
    return rows


def prepare(data_source: str, source: Path, out: Path, *, split: str = "test", limit: int | None = None) -> int:
    """Write `out` (JSONL, or parquet when it is named *.parquet, as Search-R1 ships its rows) from `source`; a
    temporary file renamed at the end, so a failure leaves no `out`."""
    if limit is not None and limit < 0:
        raise DataError(f"--limit must be 0 or more, got {limit}")
    rows: list[dict[str, Any]] = []
    try:
        for index, record in enumerate(read_records(source)):
            if limit is not None and len(rows) >= limit:
                break
            rows.append(to_row(data_source, record, index, split))
    except DataError as err:
        raise DataError(str(err) if str(err).startswith(str(source)) else f"--input {source}: {err}") from None
    if not rows and limit != 0:
        raise DataError(f"--input {source} holds no records; give a JSONL file or a JSON list of QA records")
    return write_jsonl(out, rows)
