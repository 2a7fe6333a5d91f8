"""The training config: pydantic models loaded from YAML, overridden by dotted `key=value` pairs.

Every field says what it does (and which paper it comes from); unknown keys are errors that name the key and the
nearest valid one, because a silently ignored typo (`actor.lr_warmup_step`) wastes a GPU-day. Batch sizes count
prompts (`data.train_batch_size`, `actor.mini_batch_size`) and tokens (`actor.max_tokens_per_micro_batch`); none has
to divide another: remainders become a smaller last mini-batch or micro-batch.
"""

from __future__ import annotations

import itertools
import os
from typing import Any, Literal

import yaml
from pydantic import Field, model_validator

from rlloom.core_rl.config.algorithm import (
    AdaptiveEntropyConfig,
    AlgorithmConfig,
    DynamicSamplingConfig,
    EntropyConfig,
    OverlongConfig,
    PtxConfig,
    RefSyncConfig,
    TISConfig,
)
from rlloom.core_rl.config.catalog import is_group_relative, unknown_name
from rlloom.core_rl.config.distributed import DistributedConfig
from rlloom.core_rl.config.engine import RolloutEngineName, VLLMRolloutConfig, VLLMServerRolloutConfig
from rlloom.core_rl.config.keys import ConfigError, KeyedValueError
from rlloom.core_rl.config.migration import migrate_config
from rlloom.core_rl.config.objective import AdvantageConfig, KLConfig, PolicyLossConfig
from rlloom.core_rl.config.section import Section
from rlloom.core_rl.config.streaming import StreamingConfig, TrainerMode, check_modes

__all__ = [
    "ActorConfig",
    "AdaptiveEntropyConfig",
    "AdvantageConfig",
    "AlgorithmConfig",
    "ConfigError",
    "CriticConfig",
    "DataConfig",
    "DistributedConfig",
    "DynamicSamplingConfig",
    "EntropyConfig",
    "KLConfig",
    "KeyedValueError",
    "MaxTokensStage",
    "ModelConfig",
    "OverlongConfig",
    "PolicyLossConfig",
    "PtxConfig",
    "RLConfig",
    "RefSyncConfig",
    "RolloutConfig",
    "SamplerConfig",
    "TISConfig",
    "TrackerName",
    "TrainerConfig",
    "check_warmup",
    "unknown_name",
]

TrackerName = Literal["console", "jsonl", "tensorboard", "wandb"]


def _default_trackers() -> list[TrackerName]:
    return ["console", "jsonl"]


_Section = Section


class ModelConfig(_Section):
    path: str = Field(description="Local directory of a Hugging Face causal LM (Qwen2/Qwen2.5/Llama, ...).")
    tokenizer_path: str | None = Field(default=None, description="Tokenizer directory; defaults to `path`.")
    dtype: Literal["float32", "bfloat16"] = Field(
        default="float32",
        description="Compute dtype: bf16 autocast in-process (CPU and GPU), FSDP2's mixed-precision policy on ranks "
        "(gradients reduced in fp32). Trained weights and optimizer state stay in `param_dtype`.",
    )
    param_dtype: Literal["float32", "bfloat16"] = Field(
        default="float32",
        description="dtype of trained parameters, their gradients and AdamW state. float32 = master weights with "
        "forwards in `dtype` (veRL's and torchtune's mixed precision); bfloat16 (needs dtype=bfloat16) = pure bf16, "
        "which loses AdamW updates smaller than half a bf16 step (most of them at lr 1e-6).",
    )
    attn_implementation: Literal["auto", "sdpa", "flash_attention_2", "eager"] = Field(
        default="auto",
        description="Attention kernel of the trained models: auto = flash_attention_2 with flash-attn on a GPU and "
        "bf16 compute (packed micro-batches then run its varlen kernel), else sdpa (packing builds a dense "
        "block-diagonal mask, logged once; see rlloom.core_rl.workers.attention).",
    )
    gradient_checkpointing: bool = Field(
        default=False, description="Recompute activations in backward: less memory, about 30% more compute."
    )
    freeze_vision_tower: bool = Field(
        default=False,
        description="Vision-language models: keep the vision encoder fixed and train only the language model "
        "(EasyR1's freeze_vision_tower). A model without a vision tower is refused.",
    )
    disable_dropout: bool = Field(
        default=True,
        description="Set every dropout rate of the actor, reference and critic to 0, so the update's log-probs "
        "match the old-log-prob pass's (PPO ratio 1 before the first step; TRL's disable_dropout).",
    )
    lora_rank: int = Field(
        default=0,
        ge=0,
        description="LoRA rank (Hu et al. 2021); 0 trains all weights. With LoRA the reference model is the "
        "adapter-disabled base, so no second copy is kept. Needs the `lora` extra (peft).",
    )
    lora_alpha: int = Field(default=16, ge=1, description="LoRA scaling numerator (scale = alpha / rank).")
    lora_target_modules: str | list[str] = Field(
        default="all-linear", description="Modules that get adapters (peft's `target_modules`)."
    )

    @property
    def tokenizer_source(self) -> str:
        """Where the tokenizer loads from: tokenizer_path, else the model's own folder."""
        return self.tokenizer_path or self.path

    @model_validator(mode="after")
    def _check_precision(self) -> ModelConfig:
        if self.param_dtype == "bfloat16" and self.dtype != "bfloat16":
            raise KeyedValueError(
                "model.param_dtype",
                "bfloat16 with model.dtype=float32: parameters narrower than the compute dtype lose precision for "
                "nothing; set model.dtype=bfloat16 too (pure bf16) or model.param_dtype=float32",
            )
        return self


class SamplerConfig(_Section):
    class_path: str | None = Field(
        default=None,
        description="The prompt sampler class: 'package.module:Class' or 'path/to/file.py:Class' (veRL's "
        "data.sampler.class_path and class_name in one string), or a built-in name: 'learnability' (a curriculum "
        "drawing prompts by p(1-p) of their running pass rate, LILO). Built as Class(rows, seed=trainer.seed, "
        "**kwargs); see rlloom.core_rl.data.samplers for the methods it needs. None: every row once per epoch, in the "
        "order data.shuffle and trainer.seed give.",
    )
    kwargs: dict[str, Any] = Field(
        default_factory=dict, description="Keyword arguments for the sampler's constructor (checked at load)."
    )

    @model_validator(mode="after")
    def _check_spec(self) -> SamplerConfig:
        path = self.class_path
        if path is not None and (":" not in path or path.endswith(":")):
            from rlloom.core_rl.data.samplers import BUILTIN_SAMPLERS  # torch: only for a name without a colon

            if path in BUILTIN_SAMPLERS:
                return self
            raise KeyedValueError(
                "data.sampler.class_path",
                f"{path!r} names no class; write 'package.module:Class' or 'path/to/file.py:Class' (veRL's "
                f"class_path and class_name joined by ':'), or a built-in sampler: {', '.join(BUILTIN_SAMPLERS)}",
            )
        if path is None and self.kwargs:
            raise KeyedValueError(
                "data.sampler.kwargs",
                "set but data.sampler.class_path is not; the default sampler takes none (its options are "
                "data.shuffle and trainer.seed)",
            )
        return self


class DataConfig(_Section):
    train_batch_size: int = Field(default=8, ge=1, description="Prompts per training step (before n samples each).")
    shuffle: bool = Field(default=True, description="Reshuffle the prompts every epoch (seeded by trainer.seed).")
    drop_last: bool = Field(
        default=False, description="Skip an epoch's last partial batch instead of training on a smaller one."
    )
    max_prompt_length: int | None = Field(
        default=None,
        ge=1,
        description="Prompt tokens at most (veRL's data.max_prompt_length), counted as the engine renders the "
        "prompt (chat template + generation prompt). A longer train or validation row stops the run at start, "
        "naming it, unless filter_overlong_prompts. None: no limit (the model's context still applies).",
    )
    filter_overlong_prompts: bool = Field(
        default=False,
        description="Leave rows over max_prompt_length out of training and validation (counted in a warning) "
        "instead of stopping (veRL/EasyR1's filter_overlong_prompts).",
    )
    apply_chat_template_kwargs: dict[str, Any] = Field(
        default_factory=dict,
        description="Extra variables for the chat template that renders chat prompts, in training, validation and "
        "prompt-length checks (veRL's key; TRL's chat_template_kwargs), e.g. {enable_thinking: false} for Qwen3.",
    )

    @model_validator(mode="after")
    def _check_template_kwargs(self) -> DataConfig:
        from rlloom.core_rl.contracts.generation import template_arguments_clash

        problem = template_arguments_clash(self.apply_chat_template_kwargs)
        if problem:
            raise KeyedValueError("data.apply_chat_template_kwargs", problem)
        return self

    sampler: SamplerConfig = Field(
        default_factory=SamplerConfig,
        description="Which prompts each step draws (veRL's data.sampler): a class by import path, e.g. a curriculum "
        "that sees every step's rewards.",
    )

    filter_solved: bool = Field(
        default=False,
        description="Online prompt filtering (Skywork-OR1, He et al. 2025): at each epoch start, retire the prompts "
        "whose every sample in the previous epoch was solved (accuracy 1.0); they are not sampled again.",
    )
    filter_unsolved: bool = Field(
        default=False,
        description="Also retire the prompts none of whose samples in the previous epoch was solved (accuracy 0.0).",
    )
    solved_threshold: float = Field(
        default=1.0,
        description="A sample counts as solved when its reward is >= this; a prompt's accuracy is its solved "
        "fraction (with 0/1 verifier rewards, the pass rate). Lower it for rewards with partial credit or bonuses.",
    )

    @model_validator(mode="after")
    def _check_prompt_limit(self) -> DataConfig:
        if self.filter_overlong_prompts and self.max_prompt_length is None:
            raise KeyedValueError(
                "data.filter_overlong_prompts",
                "set but data.max_prompt_length is not; give the limit in tokens (e.g. data.max_prompt_length=1024)",
            )
        return self


class MaxTokensStage(_Section):
    step: int = Field(ge=1, description="First training step (1-based) of this stage.")
    max_tokens: int = Field(ge=1, description="Response length limit in tokens from `step` on.")


class RolloutConfig(_Section):
    n: int = Field(default=4, ge=1, description="Samples per prompt: the group size of GRPO/RLOO.")
    temperature: float = Field(default=1.0, gt=0.0, description="Sampling temperature; logprobs use it too.")
    top_p: float = Field(default=1.0, gt=0.0, le=1.0, description="Nucleus sampling mass (1.0 disables it).")
    top_k: int = Field(default=0, ge=0, description="Top-k sampling (0 disables it).")
    min_p: float = Field(
        default=0.0, ge=0.0, le=1.0, description="Min-p sampling: drop tokens below min_p x the top probability."
    )
    stop: list[str] = Field(
        default_factory=list,
        description="Stop strings for training and validation rollouts (e.g. ['</answer>']); a response ends right "
        "after the first one, which stays in it. Multi-turn environments add their own.",
    )
    max_tokens: int = Field(default=256, ge=1, description="Response length limit in tokens.")
    val_temperature: float = Field(default=0.0, ge=0.0, description="Validation sampling temperature (0 = greedy).")
    val_n: int = Field(default=1, ge=1, description="Validation samples per prompt.")
    val_top_p: float | None = Field(
        default=None,
        gt=0.0,
        le=1.0,
        description="Validation nucleus sampling mass (EasyR1 and DeepSeek-R1 evaluate at 0.95); None = top_p.",
    )
    max_tokens_schedule: list[MaxTokensStage] = Field(
        default_factory=list,
        description="Multi-stage context length (Skywork-OR1; DeepScaleR's 8K -> 16K -> 24K): from each stage's "
        "`step` on, rollouts (and validation) use its `max_tokens`; before the first stage, `max_tokens`. "
        "Steps strictly increase. Empty = one stage.",
    )
    engine: RolloutEngineName = Field(
        default="hf",
        description="Rollout engine: hf (HF transformers on the actor's own module), vllm (vLLM on model.path, "
        "colocated, synced after every update) or vllm_server (a vLLM server at vllm_server.url, synced the same "
        "way); the apps' --engine flag. veRL's actor_rollout_ref.rollout.name.",
    )
    vllm: VLLMRolloutConfig = Field(default_factory=VLLMRolloutConfig, description="vLLM's settings (engine=vllm).")
    vllm_server: VLLMServerRolloutConfig = Field(
        default_factory=VLLMServerRolloutConfig, description="The external vLLM server (engine=vllm_server)."
    )

    @model_validator(mode="after")
    def _check_server_url(self) -> RolloutConfig:
        if self.engine == "vllm_server" and not self.vllm_server.url:
            raise KeyedValueError(
                "rollout.vllm_server.url",
                "is not set, and rollout.engine=vllm_server samples from that server: give its OpenAI base URL, "
                "e.g. rollout.vllm_server.url=http://127.0.0.1:8000/v1",
            )
        return self

    @model_validator(mode="after")
    def _check_validation_samples(self) -> RolloutConfig:
        if self.val_n > 1 and self.val_temperature == 0.0:
            raise KeyedValueError(
                "rollout.val_n",
                f"{self.val_n} samples per prompt, but rollout.val_temperature=0 is greedy: they would all be the "
                "same (best@n = worst@n, std@n 0) at n times the cost; sample (e.g. rollout.val_temperature=0.6) "
                "or set rollout.val_n=1",
            )
        return self

    @model_validator(mode="after")
    def _check_schedule(self) -> RolloutConfig:
        steps = [stage.step for stage in self.max_tokens_schedule]
        if any(later <= earlier for earlier, later in itertools.pairwise(steps)):
            raise KeyedValueError(
                "rollout.max_tokens_schedule",
                f"stage steps must strictly increase, got {steps}; list the stages in "
                "training-step order, one per step (e.g. [{step: 200, max_tokens: 16384}, {step: 600, ...}])",
            )
        return self

    def max_tokens_at(self, step: int) -> int:
        """The response length limit of training step `step` (1-based; 0 = before training)."""
        current = self.max_tokens
        for stage in self.max_tokens_schedule:
            if stage.step <= step:
                current = stage.max_tokens
        return current


class ActorConfig(_Section):
    lr: float = Field(default=1e-6, gt=0.0, description="AdamW peak learning rate.")
    weight_decay: float = Field(default=0.01, ge=0.0, description="AdamW weight decay.")
    betas: tuple[float, float] = Field(default=(0.9, 0.999), description="AdamW betas.")
    warmup_steps: int = Field(
        default=0, ge=0, description="Linear warm-up from lr 0, in training steps; below trainer.total_steps."
    )
    warmup_ratio: float | None = Field(
        default=None,
        ge=0.0,
        lt=1.0,
        description="Warm-up as a fraction of the run's training steps (veRL's lr_warmup_steps_ratio): "
        "int(ratio x total steps) steps, so it follows trainer.total_steps. Exclusive with warmup_steps.",
    )
    lr_schedule: Literal["constant", "cosine"] = Field(default="constant", description="Schedule after warm-up.")
    min_lr_ratio: float = Field(default=0.0, ge=0.0, le=1.0, description="Cosine floor as a fraction of lr.")
    grad_clip: float | None = Field(default=1.0, gt=0.0, description="Max global grad norm; None = no clipping.")
    ppo_epochs: int = Field(default=1, ge=1, description="Passes over each step's batch (Schulman et al. 2017).")
    mini_batch_size: int = Field(
        default=8, ge=1, description="Prompts per optimizer step (x n samples); a remainder makes a smaller one."
    )
    max_tokens_per_micro_batch: int = Field(
        default=8192, ge=1, description="Token budget of one forward/backward (dynamic batch size)."
    )
    padding_free: bool = Field(
        default=False, description="Pack sequences without padding (varlen attention) in training forwards."
    )
    share_prompt_forward: bool = Field(
        default=True,
        description="Forward a prompt once for all rows that share it (GRPO's n samples) and let the responses "
        "attend to its keys and values: the same log-probs and gradients with fewer tokens forwarded. Padded "
        "text rows in one process; packed rows, image rows, activation checkpointing and FSDP ranks take the full "
        "forward.",
    )
    restrict_lm_head: bool = Field(
        default=True,
        description="In the policy update, run the LM head only on the positions that score a loss-mask-1 token "
        "(an agent's observations and template glue are skipped): the same loss and gradients with fewer logits. "
        "false: the head on every response position (for a model whose head does not see the full sequence).",
    )
    shuffle: bool = Field(default=True, description="Shuffle rows before splitting into mini-batches.")

    def warmup_steps_for(self, total_steps: int) -> int:
        """Warm-up steps of a run of `total_steps` training steps: `warmup_ratio` of them, else `warmup_steps`."""
        if self.warmup_ratio is not None:
            return int(self.warmup_ratio * total_steps)
        return self.warmup_steps


class CriticConfig(ActorConfig):
    lr: float = Field(default=1e-5, gt=0.0, description="AdamW peak learning rate of the critic.")
    value_clip: float | None = Field(default=0.5, gt=0.0, description="PPO value clipping range; None = off.")
    path: str | None = Field(default=None, description="Critic initialisation; defaults to model.path.")


class TrainerConfig(_Section):
    total_steps: int | None = Field(default=None, ge=1, description="Training steps; None = total_epochs epochs.")
    total_epochs: int = Field(default=1, ge=1, description="Epochs over the prompts when total_steps is None.")
    output_dir: str = Field(default="runs/rlloom", description="Run folder: config, metrics, checkpoints.")
    save_every: int = Field(default=0, ge=0, description="Checkpoint every N steps (and at the end); 0 = end only.")
    keep_last: int = Field(default=2, ge=1, description="Checkpoints kept; older ones are deleted.")
    resume: str = Field(
        default="auto", description="auto (latest checkpoint if any), never, or a checkpoint directory."
    )
    critic_warmup: int = Field(
        default=0,
        ge=0,
        description="The first N steps update only the critic, so its values settle before they steer the policy "
        "(PPO with GAE). veRL's trainer.critic_warmup=N gives N-1 such steps (it counts steps from 1 and updates "
        "the actor once critic_warmup <= step).",
    )
    val_every: int = Field(default=0, ge=0, description="Validate every N steps (and at the end); 0 = never.")
    val_before_train: bool = Field(default=False, description="Validate once before the first step.")
    val_only: bool = Field(
        default=False,
        description="Validate once and stop: no training step, optimizer step or checkpoint (veRL's "
        "trainer.val_only). Validates the latest checkpoint when trainer.resume finds one, else model.path; "
        "needs validation data. Unlike veRL it does not also need val_before_train.",
    )
    mode: TrainerMode = Field(
        default="sync",
        description="sync: generate, then train. one_step_off: the next batch generates while this one trains "
        "(veRL's recipe; was trainer.one_step_off_policy). async: generators stream groups continuously under "
        "trainer.streaming's staleness bound, weights updated in flight (docs/async_rl.md). Both need an engine "
        "with weights of its own.",
    )
    streaming: StreamingConfig | None = Field(
        default=None, description="trainer.mode=async's settings ({} or null for the defaults)."
    )
    ema_beta: float | None = Field(
        default=None,
        gt=0.0,
        lt=1.0,
        description="Keep an exponential moving average of the policy's weights, ema = beta * ema + (1 - beta) * "
        "policy after every step, saved as <checkpoint>/ema (OpenRLHF's --ema_beta, e.g. 0.992). None = off.",
    )
    reward_timeout_s: float = Field(
        default=600.0,
        gt=0.0,
        description="Longest wait for one call of the reward function (a batch): past it, or when it raises, the "
        "batch scores 0 with the reason, reported once per message, and the run goes on.",
    )
    log_val_generations: int = Field(
        default=0,
        ge=0,
        description="Show this many validation samples (prompt, response, ground truth, reward) at each validation "
        "on the console, in TensorBoard and in W&B; the same samples every time. 0 = none.",
    )
    rollout_data_dir: str | None = Field(
        default=None,
        description="Write every training step's trajectories to <dir>/<step>.jsonl: prompt, response, reward and "
        "its components, advantage, finish reason (veRL's key). None = off.",
    )
    validation_data_dir: str | None = Field(
        default=None, description="Write every validation's trajectories to <dir>/<step>.jsonl. None = off."
    )

    @model_validator(mode="after")
    def _check_dump_dirs(self) -> TrainerConfig:
        train, val = self.rollout_data_dir, self.validation_data_dir
        if train and val and os.path.normpath(train) == os.path.normpath(val):
            # both write <step>.jsonl: a step that validates would replace its training generations
            raise KeyedValueError(
                "trainer.validation_data_dir",
                f"{val!r} is also trainer.rollout_data_dir, and both write <step>.jsonl there; give validation a "
                f"folder of its own (e.g. {os.path.join(os.path.normpath(val), 'validation')!r})",
            )
        return self

    @property
    def one_step_off_policy(self) -> bool:
        """Read by code written before `mode` (trainer.one_step_off_policy=true loads as mode=one_step_off)."""
        return self.mode == "one_step_off"

    seed: int = Field(default=0, description="Seed of python, numpy and torch RNGs and of data shuffling.")
    deterministic: bool = Field(
        default=False, description="torch.use_deterministic_algorithms: bitwise-repeatable runs, some speed cost."
    )
    device: str = Field(default="auto", description="auto (cuda if available, else cpu), cpu, cuda, cuda:1 ...")
    trackers: list[TrackerName] = Field(default_factory=_default_trackers, description="Where metrics go.")
    project: str = Field(default="rlloom", description="Project name for W&B.")
    run_name: str | None = Field(default=None, description="Run name for W&B/TensorBoard; default output_dir's name.")


class RLConfig(_Section):
    """A whole training run."""

    model: ModelConfig
    data: DataConfig = Field(default_factory=DataConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    actor: ActorConfig = Field(default_factory=ActorConfig)
    critic: CriticConfig = Field(default_factory=CriticConfig)
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    distributed: DistributedConfig = Field(default_factory=DistributedConfig)

    @model_validator(mode="before")
    @classmethod
    def _read_flat_keys(cls, data: Any) -> Any:
        """Configs written for the flat keys (`algorithm.tis_cap`, `data.ptx_files`, ...) load with a hint."""
        return migrate_config(data) if isinstance(data, dict) else data

    @model_validator(mode="after")
    def _check_combinations(self) -> RLConfig:
        """Settings that cannot work together, refused here rather than after the model loaded."""
        algo, rollout, trainer = self.algorithm, self.rollout, self.trainer
        estimator = algo.advantage.estimator
        if trainer.critic_warmup and not self.uses_critic:
            raise KeyedValueError(
                "trainer.critic_warmup",
                f"{trainer.critic_warmup} but algorithm.advantage.estimator={estimator} trains no critic; use "
                "algorithm.advantage.estimator=gae or set trainer.critic_warmup=0",
            )
        if is_group_relative(estimator) and rollout.n < 2:
            raise KeyedValueError(
                "rollout.n",
                f"{rollout.n} sample per prompt, but algorithm.advantage.estimator={estimator} compares each "
                "sample with the others of its prompt's group, so every advantage would be 0; set rollout.n=2 or more "
                "(GRPO papers use 8-16), or use an estimator without groups (reinforce_plus_plus, remax, gae)",
            )
        if algo.ref_sync is not None:
            why = None
            if not self.uses_reference:
                why = "there is no reference model (neither algorithm.kl.use_loss nor use_in_reward is on)"
            elif self.model.lora_rank > 0:
                why = "with LoRA the reference is the adapter-free base model, which does not move"
            elif self.distributed.num_ranks > 1:
                why = "only an in-process reference is synced; sharded workers (distributed.num_ranks > 1) keep theirs"
            if why:
                raise KeyedValueError(
                    "algorithm.ref_sync",
                    f"every {algo.ref_sync.every} steps, but {why}; set algorithm.ref_sync=null",
                )
        check_modes(self)
        if trainer.ema_beta is not None and (self.model.lora_rank > 0 or self.distributed.num_ranks > 1):
            raise KeyedValueError(
                "trainer.ema_beta",
                "is kept for the whole in-process policy only, not with LoRA (model.lora_rank > 0) or sharded "
                "workers (distributed.num_ranks > 1); set trainer.ema_beta=null",
            )
        advantage = algo.advantage
        if advantage.std_scope == "batch" and (estimator != "grpo" or not advantage.norm_by_std):
            raise KeyedValueError(
                "algorithm.advantage.std_scope",
                f"batch, but algorithm.advantage.estimator={estimator} with norm_by_std={advantage.norm_by_std} "
                "divides by no group std to replace; use algorithm.advantage.estimator=grpo with norm_by_std=true, "
                "or set algorithm.advantage.std_scope=group",
            )
        limits = [("rollout.max_tokens", rollout.max_tokens)]
        limits += [(f"rollout.max_tokens_schedule[{i}].max_tokens", s.max_tokens) for i, s in enumerate(
            rollout.max_tokens_schedule)]  # fmt: skip
        for key, limit in limits:
            if algo.overlong is not None and algo.overlong.buffer > limit:
                raise KeyedValueError(
                    "algorithm.overlong.buffer",
                    f"{algo.overlong.buffer} tokens exceeds the response limit {key}={limit}; make the buffer a part "
                    "of the limit (DAPO: 4096 of 20480) or set algorithm.overlong=null",
                )
        _check_ptx(self)
        for section in ("actor", "critic") if self.uses_critic else ("actor",):
            optim: ActorConfig = getattr(self, section)
            if optim.warmup_ratio is not None and optim.warmup_steps:
                raise KeyedValueError(
                    f"{section}.warmup_ratio",
                    f"{optim.warmup_ratio} and {section}.warmup_steps={optim.warmup_steps} are both set; give the "
                    f"warm-up one way: {section}.warmup_steps=0 or {section}.warmup_ratio=null",
                )
        if trainer.total_steps is not None:
            check_warmup(self, trainer.total_steps)
        return self

    @property
    def uses_critic(self) -> bool:
        """Whether a critic is trained (GAE's values)."""
        return self.algorithm.advantage.estimator == "gae"

    @property
    def uses_reference(self) -> bool:
        """Whether a reference model is loaded (the KL is in the loss or in the reward)."""
        return self.algorithm.kl.uses_reference

    def mini_batch_rows(self, section: Literal["actor", "critic"] = "actor") -> int:
        """Rows in one optimizer step of `actor` or `critic`: its mini_batch_size prompts, each with its rollout.n
        samples (the last mini-batch of a step may be smaller)."""
        optim: ActorConfig = self.actor if section == "actor" else self.critic
        return optim.mini_batch_size * self.rollout.n

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)


def check_warmup(cfg: RLConfig, total_steps: int) -> None:
    """Refuse a warm-up as long as the run: every step would train below the peak lr (the first at lr 0)."""
    for section in ("actor", "critic") if cfg.uses_critic else ("actor",):
        optim: ActorConfig = getattr(cfg, section)
        warmup = optim.warmup_steps_for(total_steps)
        if optim.warmup_ratio is None and warmup >= total_steps:
            raise KeyedValueError(
                f"{section}.warmup_steps",
                f"{warmup} warm-up steps but the run has {total_steps} training steps (trainer.total_steps), so the "
                f"lr never reaches {section}.lr and the first step trains at lr 0; lower {section}.warmup_steps "
                f"below {total_steps}, or give it as a fraction of the run: {section}.warmup_steps=0 "
                f"{section}.warmup_ratio=0.1",
            )


def _check_ptx(cfg: RLConfig) -> None:
    if cfg.algorithm.ptx is not None and cfg.distributed.num_ranks > 1:
        raise KeyedValueError(
            "algorithm.ptx",
            "PPO-ptx runs in the in-process actor only, not on sharded workers (distributed.num_ranks > 1); set "
            "distributed.num_ranks=1 or algorithm.ptx=null",
        )
