"""Offline difficulty filtering (Skywork-OR1): pass rates from scored samples, and the rows a band keeps."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from rlloom.rewards.difficulty import PassBand, pass_rates, select_by_pass_rate
from rlloom.rewards.evaluation import SampleRecord


def _records(verdicts: list[list[bool]]) -> list[SampleRecord]:
    """Row i's samples scored as verdicts[i], listed sample-major (the order need not be row by row)."""
    out = []
    for sample in range(len(verdicts[0])):
        for problem, row in enumerate(verdicts):
            out.append(SampleRecord(data_source="gsm8k", problem=problem, sample=sample, score=float(row[sample]),
                                    correct=row[sample]))  # fmt: skip
    return out


ROWS = [{"data_source": "gsm8k", "prompt": [{"role": "user", "content": f"q{i}"}], "extra_info": {"index": i}}
        for i in range(4)]  # fmt: skip
VERDICTS = [[False] * 4, [True, False, False, False], [True] * 4, [True, True, False, True]]


def test_pass_rates_are_each_rows_share_of_correct_samples() -> None:
    rates, per_row = pass_rates(_records(VERDICTS), 4)
    assert rates == [0.0, 0.25, 1.0, 0.75] and per_row == 4


def test_the_default_band_drops_never_and_always_solved_rows() -> None:
    selection = select_by_pass_rate(ROWS, _records(VERDICTS), PassBand())
    assert [row["extra_info"]["index"] for row in selection.kept] == [1, 3]
    assert [row["extra_info"]["pass_rate"] for row in selection.kept] == [0.25, 0.75]
    assert (selection.never_solved, selection.always_solved) == (1, 1)
    assert "kept 2 of 4 rows" in selection.summary(PassBand()) and "mean pass rate 0.500" in selection.summary(
        PassBand()
    )
    assert "pass_rate" not in ROWS[1]["extra_info"]  # the caller's rows are not changed


def test_a_band_is_strict_at_both_ends() -> None:
    kept = select_by_pass_rate(ROWS, _records(VERDICTS), PassBand(low=0.25, high=1.0)).kept
    assert [row["extra_info"]["index"] for row in kept] == [3]
    kept = select_by_pass_rate(ROWS, _records(VERDICTS), PassBand(low=0.0, high=0.75)).kept
    assert [row["extra_info"]["index"] for row in kept] == [1]


def test_rows_without_extra_info_get_one() -> None:
    rows = [{"data_source": "gsm8k", "prompt": []}, {"data_source": "gsm8k", "prompt": []}]
    kept = select_by_pass_rate(rows, _records([[True, False], [False, False]]), PassBand()).kept
    assert kept == [{"data_source": "gsm8k", "prompt": [], "extra_info": {"pass_rate": 0.5}}]


def test_uneven_or_foreign_samples_are_refused() -> None:
    records = _records(VERDICTS)
    with pytest.raises(ValueError, match=r"rows \[0\] have fewer samples"):
        pass_rates(records[1:], 4)
    with pytest.raises(ValueError, match="names problem 3, but only 3 rows"):
        pass_rates(records, 3)
    with pytest.raises(ValueError, match="no scored samples"):
        pass_rates([], 2)


def test_an_empty_band_is_refused() -> None:
    with pytest.raises(ValidationError, match="low 0.5 is not below high 0.5"):
        PassBand(low=0.5, high=0.5)
    with pytest.raises(ValidationError):
        PassBand(low=0.0, high=1.5)
