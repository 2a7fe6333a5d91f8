"""Row balancing across data-parallel ranks, and the resource check that replaces Ray's silent pending."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rlloom.core_rl.distributed.partition import balance_rows


def test_balance_rows_hand_computed() -> None:
    # longest first, each to the lightest rank: 9 (row 1) -> r0; 7 (row 3) -> r1; 5 (row 0) -> r1 (7 < 9);
    # 3 (row 4) -> r0 (9 < 12); 2 (row 2): loads tie at 12 and rows tie at 2, so the lower rank r0
    assert balance_rows([5, 9, 2, 7, 3], 2) == [[1, 2, 4], [0, 3]]
    # 5 rows on 2 ranks need not divide; 2 rows on 3 ranks leave one rank empty
    assert balance_rows([4, 4, 4, 4, 4], 2) == [[0, 2, 4], [1, 3]]
    assert balance_rows([3, 8], 3) == [[1], [0], []]
    assert balance_rows([], 2) == [[], []]


def test_balance_rows_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="parts must be >= 1"):
        balance_rows([1, 2], 0)
    with pytest.raises(ValueError, match="non-negative"):
        balance_rows([1, -2], 2)


@given(st.lists(st.integers(0, 500), max_size=40), st.integers(1, 8))
def test_balance_rows_covers_each_row_once_and_balances(counts: list[int], parts: int) -> None:
    split = balance_rows(counts, parts)
    assert len(split) == parts
    assert sorted(r for rows in split for r in rows) == list(range(len(counts)))
    loads = [sum(counts[r] for r in rows) for rows in split]
    # greedy LPT: no rank exceeds the lightest by more than the largest single row
    assert max(loads) - min(loads) <= max(counts, default=0)


def test_resource_check_names_the_setting_and_the_fix() -> None:
    from rlloom.core_rl.distributed.ray_group import _check_resources

    _check_resources({"CPU": 2.0}, ranks=3, cpus=0.5, gpus=0.0)  # 1.5 of 2 CPUs: fine
    with pytest.raises(ValueError, match=r"num_ranks=3 x distributed.cpus_per_rank=1.0 needs 3 CPUs .* has 2"):
        _check_resources({"CPU": 2.0}, ranks=3, cpus=1.0, gpus=0.0)
    with pytest.raises(ValueError, match="gpus_per_rank"):
        _check_resources({"CPU": 8.0}, ranks=2, cpus=1.0, gpus=1.0)
