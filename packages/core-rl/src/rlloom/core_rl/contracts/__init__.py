"""What passes between the trainer, the engines and the rewards: generation types, trajectories, the batch, packing,
the engine Protocols and the one replica dispatcher.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rlloom.core_rl.facade import lazy_attribute

if TYPE_CHECKING:
    from rlloom.core_rl.contracts.batch import TrajectoryBatch as TrajectoryBatch
    from rlloom.core_rl.contracts.dispatch import ReplicaDispatcher as ReplicaDispatcher
    from rlloom.core_rl.contracts.engines import AsyncClosable as AsyncClosable
    from rlloom.core_rl.contracts.engines import Closable as Closable
    from rlloom.core_rl.contracts.engines import EngineFactory as EngineFactory
    from rlloom.core_rl.contracts.engines import EngineSource as EngineSource
    from rlloom.core_rl.contracts.engines import HasContextWindow as HasContextWindow
    from rlloom.core_rl.contracts.engines import HasEosTokens as HasEosTokens
    from rlloom.core_rl.contracts.engines import HasTokenizer as HasTokenizer
    from rlloom.core_rl.contracts.engines import InflightWeightUpdate as InflightWeightUpdate
    from rlloom.core_rl.contracts.engines import ReplicaFactory as ReplicaFactory
    from rlloom.core_rl.contracts.engines import RolloutEngine as RolloutEngine
    from rlloom.core_rl.contracts.engines import SleepMode as SleepMode
    from rlloom.core_rl.contracts.engines import WeightSyncCount as WeightSyncCount
    from rlloom.core_rl.contracts.engines import WeightSyncLifecycle as WeightSyncLifecycle
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
    from rlloom.core_rl.contracts.protocols import Tracker as Tracker
    from rlloom.core_rl.contracts.trajectory import Trajectory as Trajectory

_EXPORTS = {
    "AsyncClosable": "engines",
    "Closable": "engines",
    "EngineFactory": "engines",
    "EngineSource": "engines",
    "HasContextWindow": "engines",
    "HasEosTokens": "engines",
    "HasTokenizer": "engines",
    "ReplicaFactory": "engines",
    "RolloutEngine": "engines",
    "SleepMode": "engines",
    "WeightSyncCount": "engines",
    "InflightWeightUpdate": "engines",
    "WeightSyncLifecycle": "engines",
    "ReplicaDispatcher": "dispatch",
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
    "Tracker": "protocols",
    "Trajectory": "trajectory",
    "TrajectoryBatch": "batch",
}


def __getattr__(name: str) -> Any:
    return lazy_attribute(__name__, _EXPORTS, name)
