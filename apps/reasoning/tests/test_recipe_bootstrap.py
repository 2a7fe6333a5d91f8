"""The recipes' paired bootstrap (scripts/recipes/recipe_common.py) against hand-computed intervals and scipy's."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "scripts" / "recipes"))
from recipe_common import paired_bootstrap


def test_constant_difference_gives_a_point_interval() -> None:
    got = paired_bootstrap([0.0, 1.0, 0.5, 0.0], [0.25, 1.25, 0.75, 0.25], resamples=500)
    assert (got.mean, got.low, got.high, got.rows) == pytest.approx((0.25, 0.25, 0.25, 4))
    assert got.above_zero


def test_two_rows_by_hand() -> None:
    # differences 0 and 1: a resampled mean is 0 (p 1/4), 0.5 (1/2) or 1 (1/4), so the 2.5% and 97.5% points are 0, 1
    got = paired_bootstrap([0.0, 0.0], [0.0, 1.0], resamples=20_000)
    assert (got.mean, got.low, got.high) == (0.5, 0.0, 1.0)
    assert not got.above_zero


def test_pairing_matters() -> None:
    # every row gains 0.1 but rows differ widely: paired, the interval is the point 0.1 (unpaired it would span 0)
    before = [0.0, 0.9, 0.1, 0.8, 0.2, 0.7]
    got = paired_bootstrap(before, [b + 0.1 for b in before])
    assert got.low == pytest.approx(0.1) and got.high == pytest.approx(0.1)


def test_matches_scipy_percentile_bootstrap() -> None:
    stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(7)
    before = rng.integers(0, 2, 100).astype(float)
    after = np.clip(before + rng.choice([-1.0, 0.0, 0.0, 1.0], 100), 0, 1)
    ours = paired_bootstrap(before.tolist(), after.tolist(), resamples=20_000, seed=1)
    ref = stats.bootstrap(
        (before, after),
        lambda b, a, axis=-1: np.mean(a - b, axis=axis),
        paired=True,
        vectorized=True,
        n_resamples=20_000,
        method="percentile",
        confidence_level=0.95,
        random_state=np.random.default_rng(2),
    ).confidence_interval
    assert ours.mean == pytest.approx(float(np.mean(after - before)))
    assert ours.low == pytest.approx(ref.low, abs=0.01) and ours.high == pytest.approx(ref.high, abs=0.01)


@pytest.mark.parametrize(
    ("before", "after", "level", "field"),
    [([0.0], [0.0, 1.0], 0.95, "pair each row"), ([], [], 0.95, "no rows"), ([0.0], [1.0], 1.0, "level")],
)
def test_bad_input_names_the_problem(before: list[float], after: list[float], level: float, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        paired_bootstrap(before, after, level=level)
