"""veRL's Hydra keys as aliases of ours on the command line, so a veRL (or Search-R1) command line runs as is.

Only keys whose value means the same here are aliased (a few values are translated: veRL's `-1` for "never" is our
`0`, its `vanilla` loss is our `ppo`). veRL keys with no meaning here (GPU counts, micro-batch
sizes) stay unknown-key errors with a hint (`config_keys.VERL_NAMES`), unless a launcher reads them off first as
infrastructure (`verl_infra`: reported once, changing nothing). The loader logs one info line
listing the aliases it applied.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from rlloom.core_rl.config.keys import ConfigError

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Alias:
    """veRL key → our key(s); `convert` turns veRL's value into ours (raising `ValueError` with the fix)."""

    targets: tuple[str, ...]
    convert: Callable[[Any], Any] | None = None
    section_switch: bool = False  # the value turns a section on ({}, kept as set) or off (None)


def _never_is_zero(value: Any) -> Any:
    """veRL's `-1` (never) for save/test frequencies is our `0`."""
    return 0 if isinstance(value, int) and value < 0 else value


def _top_k(value: Any) -> Any:
    """veRL's -1 (off) is our 0."""
    return 0 if isinstance(value, int) and value < 0 else value


def _resume_mode(value: Any) -> Any:
    """auto is auto, disable is never; resume_path is refused."""
    modes = {"auto": "auto", "disable": "never"}
    if value not in modes:
        raise ValueError(
            f"veRL's resume_mode={value!r} has no counterpart; use trainer.resume=auto, never, or a checkpoint "
            "directory (veRL's resume_from_path)"
        )
    return modes[value]


def _kl_type(value: Any) -> Any:
    """kl is k1, mse is k2; the others are the same names."""
    return {"kl": "k1", "mse": "k2"}.get(value, value) if isinstance(value, str) else value


def _loss_mode(value: Any) -> Any:
    """vanilla is ppo; veRL's vanilla always dual-clips (c = 3): add algorithm.policy_loss.dual_clip=3 for that."""
    return "ppo" if value == "vanilla" else value


def _max_rounds(value: Any) -> Any:
    """veRL's <= 0 (unlimited) is refused: the rounds are capped here."""
    if isinstance(value, int) and value <= 0:
        raise ValueError(
            "veRL's max_num_gen_batches <= 0 means unlimited; here the rounds are capped: set "
            "algorithm.dynamic_sampling.max_rounds to a number >= 1"
        )
    return value


def _rollout_name(value: Any) -> Any:
    """vllm is vllm, hf is hf; sglang is refused."""
    if value not in ("vllm", "hf"):
        raise ValueError(f"rollout engine {value!r} is not one of rlloom's: use vllm or hf (rollout.engine)")
    return value


def _fsdp_size(value: Any) -> Any:
    """veRL's -1 (all ranks in one shard group) is our None."""
    return None if isinstance(value, int) and value < 0 else value


def _on_off(value: Any) -> Any:
    """true turns the section on (keeping what the file set in it), false off."""
    if not isinstance(value, bool):
        raise ValueError(f"expected true or false, got {value!r}")
    return {} if value else None


_ARF = "actor_rollout_ref"
VERL_ALIASES: dict[str, Alias] = {
    "data.max_response_length": Alias(("rollout.max_tokens",)),
    f"{_ARF}.rollout.response_length": Alias(("rollout.max_tokens",)),
    "trainer.total_training_steps": Alias(("trainer.total_steps",)),
    "trainer.default_local_dir": Alias(("trainer.output_dir",)),
    "trainer.save_freq": Alias(("trainer.save_every",), _never_is_zero),
    "trainer.test_freq": Alias(("trainer.val_every",), _never_is_zero),
    "trainer.logger": Alias(("trainer.trackers",)),
    "trainer.project_name": Alias(("trainer.project",)),
    "trainer.experiment_name": Alias(("trainer.run_name",)),
    "trainer.resume_mode": Alias(("trainer.resume",), _resume_mode),
    "trainer.max_actor_ckpt_to_keep": Alias(("trainer.keep_last",)),
    "algorithm.kl_ctrl.kl_coef": Alias(("algorithm.kl.reward_coef",)),
    "algorithm.kl_ctrl.type": Alias(("algorithm.kl.controller",)),
    "algorithm.kl_ctrl.target_kl": Alias(("algorithm.kl.target",)),
    "algorithm.kl_ctrl.horizon": Alias(("algorithm.kl.horizon",)),
    "algorithm.kl_penalty": Alias(("algorithm.kl.reward_type",), _kl_type),
    "algorithm.norm_adv_by_std_in_grpo": Alias(("algorithm.advantage.norm_by_std",)),
    "algorithm.filter_groups.enable": Alias(("algorithm.dynamic_sampling",), _on_off, section_switch=True),
    "algorithm.filter_groups.max_num_gen_batches": Alias(("algorithm.dynamic_sampling.max_rounds",), _max_rounds),
    "critic.optim.lr": Alias(("critic.lr",)),
    "critic.cliprange_value": Alias(("critic.value_clip",)),
    "critic.model.path": Alias(("critic.path",)),
    "critic.model.use_remove_padding": Alias(("critic.padding_free",)),
    "critic.optim.lr_warmup_steps_ratio": Alias(("critic.warmup_ratio",)),
    "critic.optim.weight_decay": Alias(("critic.weight_decay",)),
    "critic.ppo_max_token_len_per_gpu": Alias(("critic.max_tokens_per_micro_batch",)),
    "critic.ppo_mini_batch_size": Alias(("critic.mini_batch_size",)),  # prompts in both, as the actor's
    f"{_ARF}.model.path": Alias(("model.path",)),
    f"{_ARF}.model.enable_gradient_checkpointing": Alias(("model.gradient_checkpointing",)),
    f"{_ARF}.model.lora_rank": Alias(("model.lora_rank",)),
    f"{_ARF}.model.override_config.attn_implementation": Alias(("model.attn_implementation",)),
    f"{_ARF}.model.use_remove_padding": Alias(("actor.padding_free",)),
    f"{_ARF}.actor.fsdp_config.offload_policy": Alias(("distributed.cpu_offload",)),
    f"{_ARF}.actor.fsdp_config.fsdp_size": Alias(("distributed.shard_size",), _fsdp_size),
    # between-phase offload: one switch for every model on the ranks, so give the roles' keys the same value (as
    # veRL's and Search-R1's scripts do); of different values, the last typed wins
    f"{_ARF}.actor.fsdp_config.param_offload": Alias(("distributed.param_offload",)),
    f"{_ARF}.actor.fsdp_config.optimizer_offload": Alias(("distributed.optimizer_offload",)),
    f"{_ARF}.ref.fsdp_config.param_offload": Alias(("distributed.param_offload",)),
    "critic.model.fsdp_config.param_offload": Alias(("distributed.param_offload",)),
    "critic.model.fsdp_config.optimizer_offload": Alias(("distributed.optimizer_offload",)),
    f"{_ARF}.model.lora_alpha": Alias(("model.lora_alpha",)),
    f"{_ARF}.actor.optim.lr": Alias(("actor.lr",)),
    f"{_ARF}.actor.optim.lr_warmup_steps_ratio": Alias(("actor.warmup_ratio",)),
    f"{_ARF}.actor.optim.weight_decay": Alias(("actor.weight_decay",)),
    f"{_ARF}.actor.ppo_mini_batch_size": Alias(("actor.mini_batch_size",)),  # prompts in both (not Search-R1's)
    f"{_ARF}.actor.ppo_max_token_len_per_gpu": Alias(("actor.max_tokens_per_micro_batch",)),
    f"{_ARF}.actor.ppo_epochs": Alias(("actor.ppo_epochs",)),
    f"{_ARF}.actor.grad_clip": Alias(("actor.grad_clip",)),
    f"{_ARF}.actor.use_kl_loss": Alias(("algorithm.kl.use_loss",)),
    f"{_ARF}.actor.kl_loss_coef": Alias(("algorithm.kl.loss_coef",)),
    f"{_ARF}.actor.kl_loss_type": Alias(("algorithm.kl.loss_type",), _kl_type),
    f"{_ARF}.actor.entropy_coeff": Alias(("algorithm.entropy.coef",)),
    f"{_ARF}.actor.clip_ratio": Alias(("algorithm.policy_loss.clip_low", "algorithm.policy_loss.clip_high")),
    f"{_ARF}.actor.clip_ratio_low": Alias(("algorithm.policy_loss.clip_low",)),
    f"{_ARF}.actor.clip_ratio_high": Alias(("algorithm.policy_loss.clip_high",)),
    f"{_ARF}.actor.clip_ratio_c": Alias(("algorithm.policy_loss.dual_clip",)),
    f"{_ARF}.actor.loss_agg_mode": Alias(("algorithm.policy_loss.agg_mode",)),
    f"{_ARF}.actor.policy_loss.loss_mode": Alias(("algorithm.policy_loss.name",), _loss_mode),
    f"{_ARF}.rollout.n": Alias(("rollout.n",)),
    f"{_ARF}.rollout.n_agent": Alias(("rollout.n",)),  # Search-R1's name
    f"{_ARF}.rollout.temperature": Alias(("rollout.temperature",)),
    f"{_ARF}.rollout.top_p": Alias(("rollout.top_p",)),
    f"{_ARF}.rollout.top_k": Alias(("rollout.top_k",), _top_k),
    f"{_ARF}.rollout.val_kwargs.n": Alias(("rollout.val_n",)),
    f"{_ARF}.rollout.val_kwargs.temperature": Alias(("rollout.val_temperature",)),
    f"{_ARF}.rollout.val_kwargs.top_p": Alias(("rollout.val_top_p",)),
    f"{_ARF}.rollout.name": Alias(("rollout.engine",), _rollout_name),
    f"{_ARF}.rollout.gpu_memory_utilization": Alias(("rollout.vllm.gpu_memory_utilization",)),
    f"{_ARF}.rollout.tensor_model_parallel_size": Alias(("rollout.vllm.tensor_parallel_size",)),
    f"{_ARF}.rollout.max_model_len": Alias(("rollout.vllm.max_model_len",)),
    f"{_ARF}.rollout.enforce_eager": Alias(("rollout.vllm.enforce_eager",)),
    f"{_ARF}.rollout.dtype": Alias(("rollout.vllm.dtype",)),
    f"{_ARF}.rollout.max_num_seqs": Alias(("rollout.vllm.max_num_seqs",)),
    f"{_ARF}.rollout.enable_prefix_caching": Alias(("rollout.vllm.enable_prefix_caching",)),
    "algorithm.rollout_is_threshold": Alias(("algorithm.tis.cap",)),
    "algorithm.rollout_is_mode": Alias(("algorithm.tis.mode",)),
}
"""veRL's dotted key → ours. Keys that are the same in both (`data.train_batch_size`, `trainer.total_epochs`) need
no alias; veRL's `algorithm.adv_estimator`, `gamma`, `lam` and `use_kl_in_reward` were rlloom's names too and are
read as their sections' keys by `migration.RENAMED_KEYS`, with its hint."""


@dataclass(frozen=True)
class Translated:
    """One override after aliasing: our key, our value, and the veRL key it came from (None when not aliased)."""

    key: str
    value: Any
    verl_key: str | None = None
    section_switch: bool = False
    fan_out: bool = False  # one veRL key setting several of ours (clip_ratio): applied before the others


def translate(pairs: Sequence[tuple[str, Any]]) -> list[Translated]:
    """Our keys for `(key, value)` overrides; veRL's `clip_ratio` (both bounds) comes before `clip_ratio_low/high`
    whatever the order typed, so the specific one wins as in veRL. Raises `ConfigError` for a value veRL allows
    and we do not, naming the veRL key and the fix."""
    out: list[Translated] = []
    for key, value in search_r1_mini_batch(pairs):
        alias = VERL_ALIASES.get(key)
        if alias is None:
            out.append(Translated(key, value))
            continue
        try:
            ours = alias.convert(value) if alias.convert is not None else value
        except ValueError as err:
            raise ConfigError(f"command-line override {key}={value!r} (veRL's name): {err}") from None
        fan_out = len(alias.targets) > 1
        out.extend(Translated(target, ours, key, alias.section_switch, fan_out) for target in alias.targets)
    return sorted(out, key=lambda t: not t.fan_out)


_N_AGENT = f"{_ARF}.rollout.n_agent"
_MINI_BATCH = f"{_ARF}.actor.ppo_mini_batch_size"


def search_r1_mini_batch(pairs: Sequence[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """Search-R1's veRL fork (the one with `rollout.n_agent`) counts `ppo_mini_batch_size` in trajectories; veRL
    since multiplies it by `rollout.n`, so it counts prompts, as `actor.mini_batch_size` does. With `n_agent` on the
    same command line the value becomes prompts: ceil(trajectories / n_agent) (Search-R1's 256 of n_agent 5: 52)."""
    n_agent = next((v for k, v in pairs if k == _N_AGENT), None)
    if not isinstance(n_agent, int) or n_agent < 1:
        return list(pairs)
    return [(k, -(-v // n_agent) if k == _MINI_BATCH and isinstance(v, int) else v) for k, v in pairs]


def log_aliases(translated: Sequence[Translated]) -> None:
    """One info line naming every alias applied (none: nothing logged)."""
    pairs = dict.fromkeys(f"{t.verl_key} -> {t.key}" for t in translated if t.verl_key is not None)
    if pairs:
        dual = any(t.key == "algorithm.policy_loss.dual_clip" for t in translated)
        note = "" if dual else DUAL_CLIP_NOTE
        logger.info("config: read veRL's keys as ours: %s%s", ", ".join(pairs), note)


DUAL_CLIP_NOTE = (
    "; note: veRL's vanilla loss always dual-clips (clip_ratio_c=3) and rlloom's does not unless "
    "algorithm.policy_loss.dual_clip=3 is set"
)
