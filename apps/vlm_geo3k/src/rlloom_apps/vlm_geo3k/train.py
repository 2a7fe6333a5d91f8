"""`vlm-geo3k train`: GRPO on Geometry3K rows with a Qwen2.5-VL, through core-rl's trainer. Wiring only.

Rows come from `vlm-geo3k prepare-data` (EasyR1 layout: `<image>` markers, `images`, `[value, letter]` ground
truth). Rows too long after image expansion are dropped once, before training (EasyR1's filter_overlong_prompts);
`rlloom.multimodal.vision_collector` turns each row into pixel values, image grids and M-RoPE positions once per
step and samples from the engine `rollout.engine` names (`--engine`): an `HFEngine` on the actor's own module, or
vLLM synced after every update (`rlloom.rollout.training_engine`; images go to vLLM as `multi_modal_data` with
the actor's token ids and positions, `rlloom.rollout.vllm.images`); every sample is scored by EasyR1's `math` reward
(`geo3k_easyr1`: 0.9 accuracy + 0.1 format, reported apart) in `rlloom.rewards` worker processes.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rlloom_apps.vlm_geo3k.data import check_image_paths
from rlloom_apps.vlm_geo3k.preflight import ALGORITHMS, CONFIGS, SCORERS, config_file, load_config
from rlloom_apps.vlm_geo3k.settings import VisionSettings
from transformers import AutoConfig

from rlloom.core_rl import train
from rlloom.core_rl.config import ConfigError, RLConfig
from rlloom.core_rl.data import DataError, read_jsonl
from rlloom.core_rl.workers import load_pretrained_tokenizer
from rlloom.multimodal import QwenVLProcessing
from rlloom.multimodal.collection import drop_overlong_rows, vision_collector
from rlloom.rewards.trainer_reward import RegistryReward
from rlloom.rollout import build_training_engine

__all__ = ["ALGORITHMS", "CONFIGS", "SCORERS", "config_file", "load_config", "read_jsonl", "run_train", "vllm_options"]


def vllm_options(vision: VisionSettings) -> dict[str, Any]:
    """What vLLM needs beyond `rollout.vllm` for this app's images: its image processor's pixel budget, the
    collector's (it sizes vLLM's encoder budget; each request keeps its images' processed sizes)."""
    return {"mm_processor_kwargs": {"min_pixels": vision.min_pixels, "max_pixels": vision.max_pixels}}


def run_train(
    config: RLConfig,
    vision: VisionSettings,
    *,
    train_data: Path,
    val_data: Path | None = None,
    score_workers: int | None = None,
    score_timeout: float = 30.0,
    scorers: Mapping[str, str] = SCORERS,
) -> dict[str, float]:
    """Train as the config says; returns the last step's metrics (the run folder has them all).

    `scorers` maps data sources to the reward scorer (registry name or "module:function") used instead of the
    registry's default for that source.
    """
    if not Path(config.model.path).is_dir():
        raise ConfigError(
            f"model.path={config.model.path} is not a folder; pass a local Qwen2.5-VL, e.g. "
            "model.path=/models/Qwen2.5-VL-7B-Instruct"
        )
    model_config = AutoConfig.from_pretrained(config.model.path)
    if getattr(model_config, "vision_config", None) is None:
        raise ConfigError(f"model.path={config.model.path} has no vision_config: pass a vision-language model")
    tokenizer = load_pretrained_tokenizer(config.model.tokenizer_source)
    processing = vision.processing(model_config.vision_config, config.data.apply_chat_template_kwargs)
    train_rows = _fitting_rows(train_data, "--train-data", tokenizer, processing)
    if not train_rows:
        raise ConfigError(f"--train-data {train_data} holds no rows (that fit vision.max_prompt_tokens)")
    val_rows = _fitting_rows(val_data, "--val-data", tokenizer, processing) if val_data else None
    with (
        RegistryReward(workers=score_workers, timeout=score_timeout, scorers=scorers) as reward,
        build_training_engine(config, tokenizer, vllm_options=vllm_options(vision)) as engine,
    ):
        return train(
            config,
            collect_factory=vision_collector(tokenizer, processing),
            reward_fn=reward,
            train_data=train_rows,
            val_data=val_rows,
            **engine.trainer_kwargs(),
        )


def _fitting_rows(path: Path, label: str, tokenizer: Any, processing: QwenVLProcessing) -> list[Mapping[str, Any]]:
    """The file's rows that fit the prompt limit; a row that cannot be built at all (a missing image, markers
    and images that disagree) is named with its file before the model loads, not as a traceback."""
    rows = list(read_jsonl(path))
    check_image_paths(rows, f"{label} {path}")
    try:
        return drop_overlong_rows(rows, tokenizer, processing)
    except ValueError as err:
        raise DataError(f"{label} {path}: {err}") from None
