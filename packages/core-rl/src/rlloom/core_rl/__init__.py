"""rlloom.core_rl: the batch protocol, the algorithms, the worker protocols and the single-controller trainer.

The main names are importable from here (`from rlloom.core_rl import train, load_config, TrajectoryBatch`);
they load lazily so that importing a light module such as `rlloom.core_rl.contracts.generation` does not pull in
transformers.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from rlloom.core_rl.__about__ import __version__

if TYPE_CHECKING:
    from rlloom.core_rl.config.loading import load_config
    from rlloom.core_rl.config.schema import RLConfig
    from rlloom.core_rl.contracts.batch import TrajectoryBatch
    from rlloom.core_rl.contracts.protocols import (
        CriticWorker,
        PolicyWorker,
        ReferenceWorker,
        RewardFn,
        RewardLike,
        RewardOutput,
        RolloutEngine,
        Tracker,
    )
    from rlloom.core_rl.contracts.trajectory import Trajectory
    from rlloom.core_rl.tiny import char_tokenizer, tiny_qwen2, word_tokenizer
    from rlloom.core_rl.trainer import RunFinished, Trainer, train

_LAZY = {
    "TrajectoryBatch": "rlloom.core_rl.contracts.batch",
    "RLConfig": "rlloom.core_rl.config.schema",
    "load_config": "rlloom.core_rl.config.loading",
    "CriticWorker": "rlloom.core_rl.contracts.protocols",
    "PolicyWorker": "rlloom.core_rl.contracts.protocols",
    "ReferenceWorker": "rlloom.core_rl.contracts.protocols",
    "RewardFn": "rlloom.core_rl.contracts.protocols",
    "RewardLike": "rlloom.core_rl.contracts.protocols",
    "RewardOutput": "rlloom.core_rl.contracts.protocols",
    "RolloutEngine": "rlloom.core_rl.contracts.protocols",
    "Tracker": "rlloom.core_rl.contracts.protocols",
    "char_tokenizer": "rlloom.core_rl.tiny",
    "tiny_qwen2": "rlloom.core_rl.tiny",
    "word_tokenizer": "rlloom.core_rl.tiny",
    "RunFinished": "rlloom.core_rl.trainer",
    "Trainer": "rlloom.core_rl.trainer",
    "train": "rlloom.core_rl.trainer",
    "Trajectory": "rlloom.core_rl.contracts.trajectory",
}

__all__ = [
    "CriticWorker",
    "PolicyWorker",
    "RLConfig",
    "ReferenceWorker",
    "RewardFn",
    "RewardLike",
    "RewardOutput",
    "RolloutEngine",
    "RunFinished",
    "Tracker",
    "Trainer",
    "Trajectory",
    "TrajectoryBatch",
    "__version__",
    "char_tokenizer",
    "load_config",
    "tiny_qwen2",
    "train",
    "word_tokenizer",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'rlloom.core_rl' has no attribute {name!r}")
