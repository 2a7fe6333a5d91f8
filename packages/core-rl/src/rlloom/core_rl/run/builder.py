"""Building what `Trainer` runs with, from its config and arguments, checked before anything trains.

Each function does one part of the construction (the data, the step count and resume point, the workers and
trackers, the engine and collector, the optional features' objects), so `trainer.py` holds only the loop and its
checkpoint registry. A distributed backend replaces the workers' construction (Ray worker groups) and nothing else.
"""

from __future__ import annotations

import logging
import random
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeAlias

import numpy as np
import torch
from transformers import PreTrainedTokenizerBase

from rlloom.core_rl.config.loading import config_from_dict
from rlloom.core_rl.config.schema import ConfigError, KeyedValueError, RLConfig, TrainerConfig, check_warmup
from rlloom.core_rl.contracts import engines
from rlloom.core_rl.contracts.engines import EngineSource, ReplicaFactory
from rlloom.core_rl.contracts.generation import SamplingParams
from rlloom.core_rl.contracts.protocols import CriticWorker, PolicyWorker, ReferenceWorker, RolloutEngine, Tracker
from rlloom.core_rl.data.loader import PromptLoader, Row, check_rows, limit_prompt_length
from rlloom.core_rl.data.prompt_filter import PromptFilter
from rlloom.core_rl.data.ptx import read_ptx_rows
from rlloom.core_rl.data.samplers import make_sampler
from rlloom.core_rl.observe.generation_log import GenerationDump
from rlloom.core_rl.observe.trackers import ConsoleTracker, JSONLTracker, MultiTracker, TensorBoardTracker, WandbTracker
from rlloom.core_rl.phases.collection import CollectFactory, CollectFn, single_turn_collector
from rlloom.core_rl.run.sharded_checkpoint import is_sharded, weights_source
from rlloom.core_rl.workers.actor import PolicyActor, ReferencePolicy, load_causal_lm
from rlloom.core_rl.workers.critic import ValueCritic, ValueModel
from rlloom.core_rl.workers.settings import actor_settings, critic_settings, reference_settings
from rlloom.core_rl.workers.tokenizer_loading import check_engine_tokenizer, load_pretrained_tokenizer

EngineFactory: TypeAlias = engines.EngineFactory  # its home is contracts.engines; named here too for old imports

logger = logging.getLogger(__name__)


class RunFinished(SystemExit):
    """Raised when asked to resume a run that already reached `trainer.total_steps` (exit status 1)."""


def checked_config(
    config: RLConfig,
    engine: EngineSource | None,
    engine_factory: EngineFactory | None,
    collect: CollectFn | None,
    collect_factory: CollectFactory | None,
) -> RLConfig:
    """The config, re-validated (a config changed after it was built, `cfg.rollout.n = 1`, skipped the load-time
    cross-field checks), once the engine and collector arguments are known to make sense together."""
    if collect is not None and collect_factory is not None:
        raise ValueError(
            "give the Trainer at most one of collect= (a ready CollectFn) or collect_factory= (a callable that "
            "builds one on the trainer's engine, e.g. rlloom.agent.agent_collector(...))"
        )
    engine_source(engine, engine_factory)
    return config_from_dict(config.model_dump(), source="the config given to Trainer")


@dataclass(frozen=True)
class RunData:
    """The rows a run trains and validates on, after the prompt-length limit."""

    train: list[Row]
    val: list[Row]
    tokenizer: PreTrainedTokenizerBase | None  # loaded for the limit; None when there is none


def prepare_data(
    config: RLConfig, train_data: Sequence[Row], val_data: Sequence[Row] | None, *, own_collector: bool
) -> RunData:
    """Every row checked before anything loads (a bad row otherwise fails at its first rollout), then
    `data.max_prompt_length` applied (before the loader: the limit decides the steps per epoch)."""
    check_rows(train_data, split="train", agent_rows=own_collector)
    check_rows(val_data or [], split="validation", agent_rows=own_collector)
    # measured as given, so a JsonlRows' errors name file:line
    train: Sequence[Row] = train_data
    val: Sequence[Row] = val_data or []
    tokenizer = None
    data = config.data
    if data.max_prompt_length is not None:
        tokenizer, limit, drop = load_tokenizer(config), data.max_prompt_length, data.filter_overlong_prompts
        template = data.apply_chat_template_kwargs
        train = limit_prompt_length(train, tokenizer, limit, drop=drop, split="train", chat_template_kwargs=template)
        val = limit_prompt_length(val, tokenizer, limit, drop=drop, split="validation", chat_template_kwargs=template)
    if config.trainer.val_only and not val:
        dropped = " (data.filter_overlong_prompts dropped every one)" if val_data else ""
        raise ConfigError(
            f"trainer.val_only: there are no validation rows to validate on{dropped}; pass val_data= (the apps' "
            "--val-data) or set trainer.val_only=false"
        )
    return RunData(list(train), list(val), tokenizer)


def prompt_loader(config: RLConfig, rows: Sequence[Row]) -> PromptLoader:
    """The training prompts' loader, drawing through `data.sampler`."""
    data, seed = config.data, config.trainer.seed
    sampler = make_sampler(data.sampler.class_path, data.sampler.kwargs, rows, seed=seed, shuffle=data.shuffle)
    return PromptLoader(
        rows, data.train_batch_size, shuffle=data.shuffle, seed=seed, drop_last=data.drop_last, sampler=sampler
    )


def ptx_loader(config: RLConfig) -> PromptLoader | None:
    """PPO-ptx: supervised/pretraining rows in a loader of their own, one batch per actor optimizer step."""
    ptx = config.algorithm.ptx
    if ptx is None:
        return None
    rows = read_ptx_rows(ptx.files)
    return PromptLoader(
        rows, ptx.batch_size, shuffle=config.data.shuffle, seed=config.trainer.seed, source="algorithm.ptx.files"
    )


def prompt_filter(config: RLConfig) -> PromptFilter | None:
    """Skywork-OR1's online filtering, when asked for."""
    data = config.data
    if not (data.filter_solved or data.filter_unsolved):
        return None
    return PromptFilter(
        drop_solved=data.filter_solved, drop_unsolved=data.filter_unsolved, solved_threshold=data.solved_threshold
    )


def total_training_steps(config: RLConfig, loader: PromptLoader) -> int:
    """`trainer.total_steps`, or `total_epochs` epochs of the loader; the warm-up checked against it."""
    total = config.trainer.total_steps or config.trainer.total_epochs * loader.batches_per_epoch
    try:  # validated at load when trainer.total_steps is set; here for steps counted from epochs
        check_warmup(config, total)
    except KeyedValueError as err:
        raise ConfigError(f"{err.key}: {err}") from None
    return total


def start_step(config: RLConfig, state: Mapping[str, Any] | None, total_steps: int, where: str) -> int:
    """The step a run starts after: 0, or the checkpoint's; a finished run is refused (`val_only` may validate
    one)."""
    step = int(state["step"]) if state else 0
    if step >= total_steps and not config.trainer.val_only:
        raise RunFinished(
            f"the run in {config.trainer.output_dir} already finished: checkpoint {where} is at step {step} of "
            f"trainer.total_steps={total_steps}. Ask for more steps (trainer.total_steps={total_steps + 100}) or "
            "use a new trainer.output_dir."
        )
    return step


def generation_dumps(trainer: TrainerConfig, start: int) -> tuple[GenerationDump | None, GenerationDump | None]:
    """`trainer.rollout_data_dir` and `trainer.validation_data_dir` writers (None when off)."""
    train = GenerationDump(trainer.rollout_data_dir, start_step=start) if trainer.rollout_data_dir else None
    val = GenerationDump(trainer.validation_data_dir, start_step=start) if trainer.validation_data_dir else None
    return train, val


def engine_source(engine: EngineSource | None, engine_factory: EngineFactory | None) -> EngineSource:
    """The Trainer's one `engine=`: a ready `RolloutEngine` (weights of its own, synced every step) or a provider
    of one, an `EngineFactory` (built on the actor's module) or a `ReplicaFactory` (weights of its own, one replica
    per rank). `engine_factory=`, its former name for a factory, still works this release, with a warning."""
    if (engine is None) == (engine_factory is None):
        raise ValueError(
            "give the Trainer exactly one of engine= (a RolloutEngine with its own weights, synced every step, or a "
            "callable that builds one on the actor's module, e.g. lambda module: HFEngine(module, tokenizer)) or "
            "the deprecated engine_factory="
        )
    if engine_factory is not None:
        warnings.warn(
            "Trainer(engine_factory=...) is deprecated and goes in the next release: pass the factory as engine= "
            "(which takes an engine or a provider of one)",
            DeprecationWarning,
            stacklevel=4,
        )
        return engine_factory
    assert engine is not None
    return engine


def build_engine(
    config: RLConfig,
    parts: RunParts,
    engine: EngineSource | None,
    engine_factory: EngineFactory | None,
    resume_from: Path | None,
) -> RolloutEngine:
    """The rollout engine from `engine=` (`engine_source`): a ready engine as it is; a `ReplicaFactory` (e.g.
    vLLM's) asked for an engine with weights of its own; an `EngineFactory` called with the actor's module. A
    sharded actor has no whole module here, so the engine gets its own copy of the policy, kept current by the
    weight sync every step: one replica on every rank with `distributed.rollout_on_ranks` (`rank_engines`), else
    one on the driver. `distributed.rollout_placement=separate` builds the replicas on generator actors of their
    own instead (`generators`), whatever the actor. The engine's tokenizer must be the run's."""
    source = engine if engine is not None else engine_factory
    separate = config.distributed.rollout_placement == "separate"
    if isinstance(source, RolloutEngine):
        if separate:
            raise ConfigError(
                f"distributed.rollout_placement=separate builds a replica on each generator actor, but engine= is a "
                f"ready {type(source).__name__}: pass a factory (e.g. lambda module: HFEngine(module, tokenizer), or "
                "rlloom.rollout's VLLMReplicas) or set distributed.rollout_placement=colocated"
            )
        return checked_engine(source, config, parts)
    if not (isinstance(source, ReplicaFactory) or callable(source)):
        raise TypeError(
            f"engine= is a {type(source).__name__}: give a RolloutEngine (generate/agenerate/update_weights), a "
            "callable that builds one on the actor's module, or a ReplicaFactory (build_replica(rank))"
        )
    if separate:
        from rlloom.core_rl.distributed.generators import start_generators

        # generator actors of their own, each checking its replica's tokenizer; weights from the actor every sync
        return start_generators(source, config, weights_source(resume_from, config.model.path))
    actor = parts.actor
    if not isinstance(actor, PolicyActor) and config.distributed.rollout_on_ranks:
        from rlloom.core_rl.distributed.rank_engines import start_rank_engines
        from rlloom.core_rl.distributed.ray_group import RayActorGroup

        if not isinstance(actor, RayActorGroup):
            raise TypeError(f"distributed.rollout_on_ranks needs the RayActorGroup actor, not {type(actor)}")
        # each rank checks its replica's tokenizer against the run's; a ReplicaFactory (vLLM) loads its own
        # weights there, an EngineFactory gets a copy of the policy
        return start_rank_engines(actor, source, config, weights_source(resume_from, config.model.path))
    if isinstance(source, ReplicaFactory):
        built = source.build_replica(0)  # weights of its own (e.g. vLLM): synced every step, as an engine is
    elif isinstance(actor, PolicyActor):
        if config.trainer.mode != "sync":
            raise ConfigError(
                f"trainer.mode={config.trainer.mode} generates batches while the actor trains, so the engine needs "
                "weights of its own: pass engine= a ready engine (e.g. HFEngine on a separate copy of the model) "
                "instead of a factory, which here samples from the very module the update is changing"
            )
        built = source(actor.model)
    else:
        weights = weights_source(resume_from, config.model.path)
        # never trained here: held in the compute dtype, synced from the sharded actor every step
        copy = config.model.model_copy(update={"lora_rank": 0})
        built = source(load_causal_lm(copy, weights, parts.device, trained=False))
    return checked_engine(built, config, parts)


def checked_engine(engine: object, config: RLConfig, parts: RunParts) -> RolloutEngine:
    """`engine` once it is known to be a `RolloutEngine` with the run's tokenizer."""
    if not isinstance(engine, RolloutEngine):
        raise TypeError(
            f"the engine= factory returned a {type(engine).__name__}, which lacks generate/agenerate/update_weights "
            "(the RolloutEngine protocol)"
        )
    model = config.model
    source = f"model.tokenizer_path={model.tokenizer_path}" if model.tokenizer_path else f"model.path={model.path}"
    check_engine_tokenizer(engine, parts.tokenizer, source)
    return engine


def build_collector(
    config: RLConfig, engine: RolloutEngine, collect: CollectFn | None, collect_factory: CollectFactory | None
) -> CollectFn:
    """The rollout collector: the one given, one the factory builds on the engine, or single-turn sampling."""
    template = config.data.apply_chat_template_kwargs
    check_template_variables(template, collect_factory or collect)
    if collect_factory is not None:
        collect = collect_factory(engine)
    return collect or single_turn_collector(engine, template)


def check_template_variables(wanted: Mapping[str, Any], collector: Any) -> None:
    """`data.apply_chat_template_kwargs` against a custom collector's: one that declares its own
    (`chat_template_kwargs`, as rlloom.agent's does) must render with the same, or the prompt-length check and the
    rollouts would see different prompts; one that declares none cannot be checked, so say where they go."""
    if not wanted or collector is None:
        return
    declared = getattr(collector, "chat_template_kwargs", None)
    if declared is None:
        logger.warning(
            "data.apply_chat_template_kwargs %s reaches the prompt-length check only: the custom collector renders "
            "its own prompts, so give it the same variables",
            dict(wanted),
        )
    elif dict(declared) != dict(wanted):
        raise ConfigError(
            f"data.apply_chat_template_kwargs: {dict(wanted)} differs from the collector's chat_template_kwargs "
            f"{dict(declared)} (e.g. AgentLoopConfig.chat_template_kwargs); the rollouts would render other prompts "
            "than the ones measured: give both the same"
        )


def sampling_params(config: RLConfig, step: int) -> SamplingParams:
    """Training sampling at `step`'s response limit (`rollout.max_tokens_schedule`)."""
    rollout = config.rollout
    return SamplingParams(
        n=rollout.n,
        temperature=rollout.temperature,
        top_p=rollout.top_p,
        top_k=rollout.top_k,
        min_p=rollout.min_p,
        stop=list(rollout.stop),
        max_tokens=rollout.max_tokens_at(step),
    )


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


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
