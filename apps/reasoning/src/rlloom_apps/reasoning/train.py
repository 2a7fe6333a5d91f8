"""`reasoning train`: math and code RL on prepared rows with one of the algorithm configs. Wiring only.

Rows come from `reasoning prepare-data` (or any veRL-shaped JSONL or parquet; several files, veRL's
`data.train_files` list, are one split in order): the prompt is rendered with the model's chat
template, every sample is scored by its row's `data_source` scorer (`rlloom.rewards.trainer_reward`, in worker
processes, code in the sandbox), and core-rl's `Trainer` runs the algorithm the config names, sampling from the
engine `rollout.engine` names (`--engine`): an `HFEngine` on the actor's own module (no weight copy), or vLLM
colocated with the actor and synced after every update (`rlloom.rollout.training_engine`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from rlloom_apps.reasoning.bundled import ALGORITHMS, CONFIGS  # there, the CLI's help reads them without torch
from rlloom_apps.reasoning.preflight import config_file, load_train_config  # torch-free, for the CLI's checks
from rlloom_apps.reasoning.train_files import read_rows

from rlloom.core_rl import train
from rlloom.core_rl.config import ConfigError, RLConfig
from rlloom.core_rl.workers import load_pretrained_tokenizer
from rlloom.rewards.trainer_reward import RegistryReward
from rlloom.rollout import build_training_engine


def run_train(
    config: RLConfig,
    *,
    train_data: Path | Sequence[Path],
    val_data: Path | Sequence[Path] | None = None,
    score_workers: int | None = None,
    score_timeout: float = 30.0,
) -> dict[str, float]:
    """Train as the config says; returns the last step's metrics (the run folder has them all)."""
    if not Path(config.model.path).is_dir():
        raise ConfigError(
            f"model.path={config.model.path} is not a folder; pass a local model, e.g. model.path=/models/Qwen2.5-1.5B"
        )
    train_files = [train_data] if isinstance(train_data, Path) else list(train_data)
    val_files = [val_data] if isinstance(val_data, Path) else list(val_data or [])
    train_rows = read_rows(train_files)  # several files (veRL's data.train_files): concatenated in order
    if not train_rows:
        raise ConfigError(f"--train-data {', '.join(map(str, train_files))} holds no rows")
    val_rows = read_rows(val_files) if val_files else None
    if val_files and not val_rows:  # else the run would quietly never validate
        raise ConfigError(
            f"--val-data {', '.join(map(str, val_files))} holds no rows; give prepared rows or leave --val-data out"
        )
    tokenizer = load_pretrained_tokenizer(config.model.tokenizer_source)
    with (
        RegistryReward(workers=score_workers, timeout=score_timeout) as reward,
        build_training_engine(config, tokenizer) as engine,
    ):
        return train(config, reward_fn=reward, train_data=train_rows, val_data=val_rows, **engine.trainer_kwargs())


__all__ = ["ALGORITHMS", "CONFIGS", "config_file", "load_train_config", "run_train"]
