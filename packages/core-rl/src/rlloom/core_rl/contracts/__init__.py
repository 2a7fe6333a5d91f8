"""What passes between the trainer, the engines and the rewards: generation types, trajectories, the batch, packing,
the engine Protocols and the one replica dispatcher.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rlloom.core_rl.facade import lazy_attribute

if TYPE_CHECKING:
    from rlloom.core_rl.contracts.batch import TrajectoryBatch as TrajectoryBatch
    from rlloom.core_rl.contracts.generation import Completion as Completion
    from rlloom.core_rl.contracts.generation import GenerationRequest as GenerationRequest
    from rlloom.core_rl.contracts.generation import SamplingParams as SamplingParams
    from rlloom.core_rl.contracts.generation import check_chat_template_kwargs as check_chat_template_kwargs
    from rlloom.core_rl.contracts.generation import template_arguments_clash as template_arguments_clash
    from rlloom.core_rl.contracts.prompts import render_prompt as render_prompt
    from rlloom.core_rl.contracts.protocols import CriticWorker as CriticWorker
    from rlloom.core_rl.contracts.protocols import PolicyWorker as PolicyWorker
    from rlloom.core_rl.contracts.protocols import ReferenceWorker as ReferenceWorker
    from rlloom.core_rl.contracts.protocols import RewardFn as RewardFn
    from rlloom.core_rl.contracts.protocols import RewardLike as RewardLike
    from rlloom.core_rl.contracts.protocols import RewardOutput as RewardOutput
    from rlloom.core_rl.contracts.protocols import RolloutEngine as RolloutEngine
    from rlloom.core_rl.contracts.protocols import Tracker as Tracker
    from rlloom.core_rl.contracts.trajectory import Trajectory as Trajectory

_EXPORTS = {
    "Completion": "generation",
    "GenerationRequest": "generation",
    "SamplingParams": "generation",
    "check_chat_template_kwargs": "generation",
    "template_arguments_clash": "generation",
    "render_prompt": "prompts",
    "CriticWorker": "protocols",
    "PolicyWorker": "protocols",
    "ReferenceWorker": "protocols",
    "RewardFn": "protocols",
    "RewardLike": "protocols",
    "RewardOutput": "protocols",
    "RolloutEngine": "protocols",
    "Tracker": "protocols",
    "Trajectory": "trajectory",
    "TrajectoryBatch": "batch",
}


def __getattr__(name: str) -> Any:
    return lazy_attribute(__name__, _EXPORTS, name)
