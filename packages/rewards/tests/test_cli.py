"""The CLI end to end: a JSONL file with good and bad lines, scored through the worker pool."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rlloom.rewards.cli import main


def _write(path: Path, lines: list[str]) -> None:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def test_score_file_with_bad_lines(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    _write(
        src,
        [
            json.dumps({"response": "<answer>Paris</answer>", "ground_truth": ["Paris"], "data_source": "nq"}),
            "{not json",
            json.dumps(
                {
                    "response": "<answer>Lyon</answer>",
                    "reward_model": {"ground_truth": {"target": ["Paris"]}},
                    "data_source": "hotpotqa",
                }
            ),
            json.dumps({"ground_truth": "x", "data_source": "nq"}),
            json.dumps([1, 2]),
            json.dumps({"response": "<answer>the Paris</answer>", "ground_truth": "paris", "data_source": "nq"}),
        ],
    )
    code = main(["score", str(src), "--out", str(out), "--workers", "1", "--timeout", "20", "--quiet"])
    assert code == 2  # bad lines make the exit status non-zero
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == 6  # one output line per input line, in order
    assert [r.get("score") for r in records] == [1.0, None, 0.0, None, None, 1.0]
    assert records[1]["line"] == 2 and "Expecting property name" in records[1]["input_error"]
    assert "'response' is missing" in records[3]["input_error"]
    assert "expected a JSON object, got list" in records[4]["input_error"]
    assert records[0]["score_components"] == {"em": 1.0, "f1": 1.0, "sub_em": 1.0}
    err = " ".join(capsys.readouterr().err.split())
    assert "in.jsonl:2: skipped" in err and "3 bad input lines" in err and "hotpotqa" in err


def test_custom_scorer_file_and_keys(tmp_path: Path) -> None:
    scorer_file = tmp_path / "my_reward.py"
    scorer_file.write_text("def length_reward(response, ground_truth, *, extra_info=None):\n    return len(response)\n")
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    _write(src, [json.dumps({"completion": "abc", "label": 1}), json.dumps({"completion": "abcdef", "label": 2})])
    code = main(["score", str(src), "--scorer", f"{scorer_file}:length_reward", "--response-key", "completion",
                 "--gt-key", "label", "--out", str(out), "--workers", "0", "--quiet"])  # fmt: skip
    assert code == 0
    assert [json.loads(line)["score"] for line in out.read_text().splitlines()] == [3.0, 6.0]


def test_console_script_entry_point(tmp_path: Path) -> None:
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    _write(src, [json.dumps({"response": "<think>t</think><answer>a</answer>", "ground_truth": None})])
    run = subprocess.run(
        [sys.executable, "-m", "rlloom.rewards.cli", "score", str(src), "--scorer", "r1_format", "--out", str(out),
         "--workers", "0", "--quiet"],
        check=False, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert json.loads(out.read_text())["score"] == 1.0
    missing = subprocess.run(
        [sys.executable, "-m", "rlloom.rewards.cli", "score", str(tmp_path / "nope.jsonl"), "--out", str(out)],
        check=False, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert missing.returncode == 1 and "does not exist" in missing.stderr


def test_out_parents_are_created_and_bad_workers_are_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"response": "\\boxed{2}", "ground_truth": "2", "data_source": "gsm8k"}) + "\n")
    out = tmp_path / "new" / "sub" / "x.jsonl"
    assert main(["score", str(src), "--out", str(out), "--workers", "0", "--quiet"]) == 0
    assert json.loads(out.read_text())["score"] == 1.0
    with pytest.raises(SystemExit) as exit_info:
        main(["score", str(src), "--out", str(out), "--workers", "-1"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "--workers must be 0" in err and "score_batch" not in err


def test_a_sandbox_timeout_is_counted_as_a_timeout() -> None:
    from rlloom.rewards.batch import ScoreItem
    from rlloom.rewards.cli import error_kind, summary_table
    from rlloom.rewards.types import ScoreResult

    results = [
        ScoreResult(score=0.0, details={"status": "timeout"}),  # a program that hit the code sandbox's time limit
        ScoreResult(score=0.0, error="scorer timed out after 1 s", details={"error_kind": "timeout"}),  # the pool's
        ScoreResult(score=0.0, error="crashed", details={"error_kind": "crash"}),
        ScoreResult(score=0.0, error="error: NameError", details={"status": "error"}),
        ScoreResult(score=1.0),
    ]
    assert [error_kind(r) for r in results] == ["timeout", "timeout", "crash", "error", None]
    items = [ScoreItem(response="x", ground_truth="1", data_source="mbpp")] * len(results)
    table = summary_table(items, results, 0)
    cells = [column._cells[0] for column in table.columns]
    assert cells[4:] == ["1", "2", "1"]  # errors, timeouts, crashes: each error counted once


@pytest.mark.parametrize("spec", ["gsm8kk", "no_such_module_xyz:fn", "rlloom.rewards.qa:no_such_fn"])
def test_an_unknown_scorer_fails_before_scoring(tmp_path: Path, capsys: pytest.CaptureFixture[str], spec: str) -> None:
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    _write(src, [json.dumps({"response": "#### 72", "ground_truth": "72"})])
    with pytest.raises(SystemExit) as exit_info:
        main(["score", str(src), "--scorer", spec, "--out", str(out), "--workers", "0", "--quiet"])
    assert exit_info.value.code == 2 and not out.exists()
    assert "--scorer: " in capsys.readouterr().err


def test_a_shortened_flag_is_refused_not_taken_as_the_flag_it_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """argparse would read `--work 1` as `--workers 1`; a prefix must be refused (exit 2)."""
    src = tmp_path / "in.jsonl"
    src.write_text('{"response": "4", "ground_truth": "4", "data_source": "gsm8k"}\n')
    with pytest.raises(SystemExit) as exit_info:
        main(["score", str(src), "--out", str(tmp_path / "out.jsonl"), "--work", "1"])
    assert exit_info.value.code == 2
    assert "unrecognized arguments: --work" in capsys.readouterr().err
