"""The seams between packages: what rollout engines, reward functions, trackers and workers must provide.

Anything with these methods fits; no base class to inherit. The trainer only ever talks to these, so the
embedded defaults (in-process HF engine, local scorers) and the scaled-out ones (vLLM replicas, Ray workers,
remote sandboxes) are interchangeable by config. The engine's contract, `RolloutEngine`, its optional
capabilities and what the Trainer's `engine=` takes, is `contracts.engines` (the first and last re-exported here).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import torch

from rlloom.core_rl.contracts.engines import EngineFactory, EngineSource, RolloutEngine
from rlloom.core_rl.contracts.trajectory import Trajectory

if TYPE_CHECKING:
    from rlloom.core_rl.contracts.batch import TrajectoryBatch


@dataclass(slots=True)
class RewardOutput:
    """A reward for one trajectory and the named parts it was made of (all logged)."""

    score: float
    components: dict[str, float] = field(default_factory=dict)
    error: str | None = None


class RewardLike(Protocol):
    """What the trainer reads of a reward: `RewardOutput`, or any result with these fields (rlloom-rewards'
    `ScoreResult` has them, so its scorers plug in without a conversion)."""

    @property
    def score(self) -> float: ...
    @property
    def components(self) -> Mapping[str, float]: ...
    @property
    def error(self) -> str | None: ...


@runtime_checkable
class RewardFn(Protocol):
    """Scores a batch of finished trajectories; must not raise for a bad response (score it 0 instead)."""

    def __call__(self, trajectories: Sequence[Trajectory]) -> Sequence[RewardLike]: ...


@runtime_checkable
class Tracker(Protocol):
    """Receives one flat dict of metrics per step (console, JSONL, TensorBoard, W&B ...)."""

    def log(self, metrics: Mapping[str, float], step: int) -> None: ...

    def log_config(self, config: Mapping[str, Any]) -> None: ...

    def close(self) -> None: ...


@runtime_checkable
class GenerationTracker(Protocol):
    """A tracker that can also show sample generations (`trainer.log_val_generations`): a table of records
    from `rlloom.core_rl.observe.generation_log` (prompt, response, ground truth, reward ...). Optional: trackers that
    lack it get metrics only."""

    def log_generations(self, records: Sequence[Mapping[str, Any]], step: int, *, title: str) -> None: ...


@runtime_checkable
class PolicyWorker(Protocol):
    """The actor: log-probs under the current policy and PPO updates.

    Implementations may hold a shard of the model on each of many ranks (Ray + FSDP2); a call receives the whole
    batch and returns results for the whole batch, however the work is split underneath.
    """

    def compute_logprobs(
        self, batch: TrajectoryBatch, *, temperature: float, entropy: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Per-token log-probs `[B, R]` of the response tokens (0 on padding), no gradient; with `entropy`,
        also the per-token entropies (logged as the policy's entropy without a second forward)."""
        ...

    def update_policy(
        self,
        batch: TrajectoryBatch,
        *,
        temperature: float = 1.0,
        entropy_coef: float | None = None,
        ptx_batch: Callable[[], TrajectoryBatch] | None = None,
    ) -> dict[str, float]:
        """PPO epochs over mini-batches of `batch` (needs old_logprobs, advantages); returns mean metrics.
        `ptx_batch`, with `algorithm.ptx` set, is called for one PPO-ptx batch per optimizer step, whose
        language-model NLL joins the loss with weight `algorithm.ptx.coef` (logged as `actor/ptx_loss`).
        `temperature` is the rollout's, so the new log-probs are of the distribution that was sampled;
        `entropy_coef` is this step's entropy-bonus weight (None = the configured `algorithm.entropy.coef`).
        When the batch gets one optimizer step (`actor.ppo_epochs` 1, one mini-batch), the trainer may leave
        old_logprobs out (`algorithm.old_logprobs=auto`): the update then uses its own, detached, and returns the
        `actor/entropy`, `actor/kl_mean` and `mismatch/*` diagnostics a separate forward would have given."""
        ...

    def named_weights(self) -> Mapping[str, torch.Tensor]:
        """Current weights under HF parameter names, for `RolloutEngine.update_weights`."""
        ...

    def save_pretrained(self, path: str) -> None:
        """Write the weights in Hugging Face format (`from_pretrained(path)` loads them)."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """Training state besides the weights (optimizer, scheduler, shuffling RNG), for checkpoints."""
        ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...


@runtime_checkable
class ReferenceWorker(Protocol):
    """The frozen reference policy of the KL term."""

    def compute_logprobs(
        self, batch: TrajectoryBatch, *, temperature: float, entropy: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]: ...


@runtime_checkable
class CriticWorker(Protocol):
    """The value model of PPO/GAE."""

    def compute_values(self, batch: TrajectoryBatch) -> torch.Tensor:
        """Per-token values `[B, R]` (value of the state before each response token), no gradient."""
        ...

    def update_critic(self, batch: TrajectoryBatch) -> dict[str, float]:
        """Value-loss epochs over `batch` (needs values, returns); returns mean metrics."""
        ...

    def save_pretrained(self, path: str) -> None: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...


__all__ = [
    "CriticWorker",
    "EngineFactory",
    "EngineSource",
    "GenerationTracker",
    "PolicyWorker",
    "ReferenceWorker",
    "RewardFn",
    "RewardLike",
    "RewardOutput",
    "RolloutEngine",
    "Tracker",
]
