"""The seams between packages: what rollout engines, reward functions and trackers must provide.

Anything with these methods fits; no base class to inherit. The trainer only ever talks to these, so the
embedded defaults (in-process HF engine, local scorers) and the scaled-out ones (vLLM replicas, Ray workers,
remote sandboxes) are interchangeable by config.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch

from rlloom.core_rl.generation import Completion, GenerationRequest
from rlloom.core_rl.trajectory import Trajectory


@runtime_checkable
class RolloutEngine(Protocol):
    """Generates completions and accepts new policy weights."""

    def generate(self, requests: Sequence[GenerationRequest]) -> list[list[Completion]]:
        """Complete every request; the outer list follows `requests`, the inner one holds its n samples."""
        ...

    async def agenerate(self, request: GenerationRequest) -> list[Completion]:
        """Complete one request without blocking the event loop (agents interleave many of these)."""
        ...

    def update_weights(self, named_tensors: Mapping[str, torch.Tensor]) -> None:
        """Load new policy weights (HF parameter names); a no-op when the engine shares the actor's tensors."""
        ...


@dataclass(slots=True)
class RewardOutput:
    """A reward for one trajectory and the named parts it was made of (all logged)."""

    score: float
    components: dict[str, float] = field(default_factory=dict)
    error: str | None = None


@runtime_checkable
class RewardFn(Protocol):
    """Scores a batch of finished trajectories; must not raise for a bad response (score it 0 instead)."""

    def __call__(self, trajectories: Sequence[Trajectory]) -> list[RewardOutput]: ...


@runtime_checkable
class Tracker(Protocol):
    """Receives one flat dict of metrics per step (console, JSONL, TensorBoard, W&B ...)."""

    def log(self, metrics: Mapping[str, float], step: int) -> None: ...

    def log_config(self, config: Mapping[str, Any]) -> None: ...

    def close(self) -> None: ...
