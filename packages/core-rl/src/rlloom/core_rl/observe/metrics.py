"""The standard per-step metrics computed from a finished batch, and wall-clock timing per phase."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping, Sequence

import torch

from rlloom.core_rl.algorithms import masked_mean
from rlloom.core_rl.contracts.batch import TrajectoryBatch
from rlloom.core_rl.contracts.trajectory import Trajectory
from rlloom.core_rl.observe import progress


class PhaseTimer:
    """Accumulates seconds per named phase (`with timer("rollout"): ...`); a phase may run several times."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            with progress.phase(phase):  # a line every few seconds from what the phase reports (progress.advance)
                yield
        finally:
            self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - start

    def metrics(self) -> dict[str, float]:
        out = {f"timing/{k}_s": v for k, v in self.seconds.items()}
        out["timing/step_s"] = sum(self.seconds.values())
        return out


def _stats(prefix: str, values: torch.Tensor) -> dict[str, float]:
    values = values.float()
    if values.numel() == 0:
        return {}
    return {
        f"{prefix}/mean": float(values.mean()),
        f"{prefix}/std": float(values.std()) if values.numel() > 1 else 0.0,
        f"{prefix}/max": float(values.max()),
        f"{prefix}/min": float(values.min()),
    }


def metric_means(records: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """`{key}/mean` over all records for every key any record has; a record without the key counts as 0.

    Per-trajectory counters (an agent's turns, searches, tool errors) are only written when they happen, so a
    missing key means zero, not unknown.
    """
    if not records:
        return {}
    keys = sorted({k for r in records for k in r})
    return {f"{k}/mean": sum(float(r.get(k, 0.0)) for r in records) / len(records) for k in keys}


def component_means(components: Sequence[Mapping[str, float]], prefix: str = "") -> dict[str, float]:
    """`{prefix}reward_components/{key}`: each reward component's mean over the trajectories that report it (a
    trajectory whose scoring failed reports none, and is not counted as a 0 of every component)."""
    values: dict[str, list[float]] = {}
    for comp in components:
        for key, value in comp.items():
            values.setdefault(key, []).append(float(value))
    return {f"{prefix}reward_components/{key}": sum(v) / len(v) for key, v in sorted(values.items())}


def batch_metrics(batch: TrajectoryBatch, *, max_response_length: int) -> dict[str, float]:
    """Reward mean/std (and per component, per data source), lengths and clip ratio, advantage/value stats, and
    the means of the trajectories' own metrics (`rollout/...`: an agent's turns, tool calls, latencies)."""
    out: dict[str, float] = {}
    if "scores" in batch.tensors:
        scores = batch["scores"]
        out.update(_stats("reward", scores))
        sources = batch.non_tensors.get("data_source", [])
        for source in sorted(set(sources)) if len(set(sources)) > 1 else []:
            rows = [i for i, s in enumerate(sources) if s == source]
            out[f"reward/{source}/mean"] = float(scores[rows].mean())
    out.update(component_means(batch.non_tensors.get("reward_components", [])))
    lengths = batch["response_lengths"]
    out.update({k: v for k, v in _stats("response_length", lengths).items() if not k.endswith("/std")})
    finish = batch.non_tensors.get("finish_reason", [])
    clipped = [r == "length" for r in finish] if finish else (lengths >= max_response_length).tolist()
    out["response_length/clip_ratio"] = sum(clipped) / max(len(clipped), 1)
    out["prompt_length/mean"] = float(batch["prompt_lengths"].float().mean())
    mask = batch.loss_mask
    for key in ("advantages", "returns", "values"):
        if key in batch.tensors:
            out[f"{key}/mean"] = float(masked_mean(batch[key], mask))
    out.update({f"rollout/{k}": v for k, v in metric_means(batch.non_tensors.get("traj_metrics", [])).items()})
    out["batch/samples"] = float(batch.batch_size)
    out["batch/response_tokens"] = float(mask.sum())
    return out


def best_worst_at_n(rewards: Sequence[float], group_ids: Sequence[str], prefix: str) -> dict[str, float]:
    """With n samples per prompt: `<prefix>/best@n` and `<prefix>/worst@n`, the mean over prompts of the best and
    of the worst of its samples' rewards, and `<prefix>/std@n`, the mean within-prompt standard deviation (veRL's
    validation best@N/worst@N/std@N, here at the full N, not bootstrapped). With 0/1 rewards best@n is pass@n.

    Groups of different sizes are named by the largest (a prompt whose collector returned fewer samples still
    counts); nothing is returned when every group has one sample.
    """
    if len(rewards) != len(group_ids):
        raise ValueError(f"best_worst_at_n: {len(rewards)} rewards for {len(group_ids)} group ids")
    groups: dict[str, list[float]] = {}
    for reward, group in zip(rewards, group_ids, strict=True):
        groups.setdefault(group, []).append(float(reward))
    n = max((len(g) for g in groups.values()), default=0)
    if n < 2:
        return {}
    values = list(groups.values())
    stds = [float(torch.tensor(g).std(unbiased=False)) for g in values]
    return {
        f"{prefix}/best@{n}": sum(max(g) for g in values) / len(values),
        f"{prefix}/worst@{n}": sum(min(g) for g in values) / len(values),
        f"{prefix}/std@{n}": sum(stds) / len(stds),
    }


def validation_metrics(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """Validation's reward (overall and per data source, with best/worst/std@n over each prompt's samples), reward
    components, response length and the rollout's own metrics."""
    rewards = [t.reward or 0.0 for t in trajectories]
    out = {"val/reward/mean": float(torch.tensor(rewards).mean())}
    for source in sorted({t.data_source for t in trajectories}):
        picked = [t for t in trajectories if t.data_source == source]
        name = f"val/reward/{source or 'default'}"
        out[f"{name}/mean"] = sum(t.reward or 0.0 for t in picked) / len(picked)
        out.update(best_worst_at_n([t.reward or 0.0 for t in picked], [t.group_id for t in picked], name))
    out.update(component_means([t.reward_components for t in trajectories], prefix="val/"))
    out["val/response_length/mean"] = sum(len(t.response_ids) for t in trajectories) / len(trajectories)
    out.update({f"val/rollout/{k}": v for k, v in metric_means([t.metrics for t in trajectories]).items()})
    return out


def mean_advantages(batch: TrajectoryBatch) -> list[float | None]:
    """Each row's mean advantage over its sampled tokens (None for a row with none), for generation dumps."""
    mask = batch.loss_mask.float()
    sampled = mask.sum(-1)
    means = (batch["advantages"].float() * mask).sum(-1) / sampled.clamp(min=1)
    return [float(m) if n > 0 else None for m, n in zip(means.tolist(), sampled.tolist(), strict=True)]
