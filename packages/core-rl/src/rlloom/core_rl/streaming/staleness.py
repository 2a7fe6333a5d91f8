"""Per-batch staleness metrics of asynchronous RL: how many updates separate the weights that sampled each
trajectory's oldest token from those it trains from, and how many versions one batch spans."""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Sequence

from rlloom.core_rl.contracts.trajectory import Trajectory


def staleness_metrics(trajectories: Sequence[Trajectory], *, trainer_version: int) -> dict[str, float]:
    """`async/staleness_mean|max|p50` over trajectories (lag = trainer_version − the version of its oldest sampled
    token), `async/staleness_count/<lag>` (trajectories per lag), `async/version_spread` (newest − oldest token
    version in the batch) and `async/multi_version_frac` (responses sampled by more than one version)."""
    lags: list[int] = []
    versions: list[int] = []
    spanning = 0
    for traj in trajectories:
        labels = [v for v, m in zip(traj.policy_versions or [], traj.loss_mask, strict=False) if m]
        if not labels:
            continue
        lags.append(trainer_version - min(labels))
        versions += (min(labels), max(labels))
        spanning += int(min(labels) != max(labels))
    if not lags:
        return {}
    out = {
        "async/staleness_mean": statistics.fmean(lags),
        "async/staleness_max": float(max(lags)),
        "async/staleness_p50": float(statistics.median(lags)),
        "async/version_spread": float(max(versions) - min(versions)),
        "async/multi_version_frac": spanning / len(lags),
    }
    out.update({f"async/staleness_count/{lag}": float(n) for lag, n in sorted(Counter(lags).items())})
    return out


__all__ = ["staleness_metrics"]
