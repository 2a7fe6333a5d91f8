"""Building a run's parts from its config: device, tokenizer, actor/reference/critic workers, trackers.

Kept apart from the loop so `trainer.py` reads as the algorithm; a distributed backend replaces this file's
worker construction (Ray worker groups) and nothing else.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import PreTrainedTokenizerBase

from rlloom.core_rl.config.schema import RLConfig
from rlloom.core_rl.contracts.protocols import CriticWorker, PolicyWorker, ReferenceWorker, Tracker
from rlloom.core_rl.observe.trackers import ConsoleTracker, JSONLTracker, MultiTracker, TensorBoardTracker, WandbTracker
from rlloom.core_rl.run.sharded_checkpoint import is_sharded, weights_source
from rlloom.core_rl.workers.actor import PolicyActor, ReferencePolicy, load_causal_lm
from rlloom.core_rl.workers.critic import ValueCritic, ValueModel
from rlloom.core_rl.workers.settings import actor_settings, critic_settings, mini_batch_rows, reference_settings
from rlloom.core_rl.workers.tokenizer_loading import load_pretrained_tokenizer

__all__ = ["RunParts", "build_run", "default_trackers", "load_tokenizer", "mini_batch_rows", "resolve_device"]


def load_tokenizer(cfg: RLConfig) -> PreTrainedTokenizerBase:
    """The run's tokenizer: `model.tokenizer_path`, else the model folder's."""
    return load_pretrained_tokenizer(cfg.model.tokenizer_path or cfg.model.path)


@dataclass
class RunParts:
    """What the loop talks to, typed by protocol so a distributed backend can stand in for each worker."""

    device: torch.device
    tokenizer: PreTrainedTokenizerBase
    pad_token_id: int
    actor: PolicyWorker
    reference: ReferenceWorker | None
    critic: CriticWorker | None
    tracker: MultiTracker


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"trainer.device={name!r} but no CUDA device is visible; use trainer.device=cpu")
    return device


def build_run(
    cfg: RLConfig,
    *,
    total_steps: int,
    resume_from: Path | None,
    output_dir: Path,
    start_step: int,
    trackers: Sequence[Tracker] | None,
    tokenizer: PreTrainedTokenizerBase | None = None,
) -> RunParts:
    """Everything `Trainer` needs; weights come from `resume_from` when resuming, else from `model.path`
    (`tokenizer`: the run's, when the caller has already loaded it)."""
    torch.use_deterministic_algorithms(cfg.trainer.deterministic)
    device = resolve_device(cfg.trainer.device)
    output_dir.mkdir(parents=True, exist_ok=True)  # config.yaml is written by run_folder.record_config

    tokenizer = tokenizer if tokenizer is not None else load_tokenizer(cfg)
    pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    if pad_token_id is None:
        raise ValueError(f"the tokenizer of {cfg.model.path} has neither a pad nor an eos token; set one")

    actor: PolicyWorker
    reference: ReferenceWorker | None = None
    critic: CriticWorker | None = None
    # a checkpoint of ranks holds DCP shards, not HF weights: start from the base models, the shards load after
    sharded = is_sharded(resume_from)
    hf_checkpoint = None if sharded else resume_from
    critic_path = str(hf_checkpoint / "critic") if hf_checkpoint else (cfg.critic.path or cfg.model.path)
    if cfg.distributed.num_ranks > 1:
        from rlloom.core_rl.distributed.ray_group import RayActorGroup

        group = RayActorGroup(
            cfg,
            total_steps=total_steps,
            weights_path=weights_source(resume_from, cfg.model.path),
            with_reference=cfg.uses_reference,
            critic_path=critic_path if cfg.uses_critic else None,
            resume_from=str(hf_checkpoint) if hf_checkpoint is not None else None,
        )
        actor, reference, critic = group, group.reference, group.critic
    else:
        actor, reference = _in_process_workers(cfg, device, total_steps=total_steps, resume_from=hf_checkpoint)
    if cfg.uses_critic and critic is None:
        critic = ValueCritic(
            ValueModel.from_pretrained(cfg.model, critic_path, device), **critic_settings(cfg, total_steps, device)
        )
    tracker = MultiTracker(
        list(trackers) if trackers is not None else default_trackers(cfg, output_dir, total_steps, start_step)
    )
    return RunParts(device, tokenizer, int(pad_token_id), actor, reference, critic, tracker)


def _in_process_workers(
    cfg: RLConfig, device: torch.device, *, total_steps: int, resume_from: Path | None
) -> tuple[PolicyActor, ReferencePolicy | None]:
    weights = str(resume_from or cfg.model.path)
    actor_model = load_causal_lm(cfg.model, weights, device, resume_from=resume_from, seed=cfg.trainer.seed)
    actor = PolicyActor(actor_model, **actor_settings(cfg, total_steps, device))
    reference = None
    if cfg.uses_reference:
        # with LoRA the reference is the adapter-disabled base: no second copy
        lora = cfg.model.lora_rank > 0
        ref_model = actor_model if lora else load_causal_lm(cfg.model, cfg.model.path, device)
        reference = ReferencePolicy(ref_model, **reference_settings(cfg, device))
    return actor, reference


def default_trackers(cfg: RLConfig, output_dir: Path, total_steps: int, start_step: int) -> list[Tracker]:
    """The trackers `trainer.trackers` names, resuming their files at `start_step`."""
    run_name = cfg.trainer.run_name or output_dir.name
    made: list[Tracker] = []
    for name in cfg.trainer.trackers:
        if name == "console":
            made.append(ConsoleTracker(total_steps, start_step))
        elif name == "jsonl":
            made.append(JSONLTracker(output_dir / "metrics.jsonl", resume_step=start_step))
        elif name == "tensorboard":
            made.append(TensorBoardTracker(output_dir / "tensorboard", resume_step=start_step))
        else:
            made.append(WandbTracker(cfg.trainer.project, run_name, output_dir, cfg.model_dump(mode="json")))
    return made
