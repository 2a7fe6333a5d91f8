"""Names other trainers give a setting, typed under any section: `actor.learning_rate=1e-6` answers "did you mean
'actor.lr'?" rather than the nearest spelling (`actor.padding_free`). TRL's `GRPOConfig` names come first; the
others are Hugging Face `TrainingArguments`', OpenRLHF's and veRL's leaf names. Each value is the rlloom key,
optionally followed by a note in parentheses.
"""

from __future__ import annotations

from rlloom.core_rl.config.compat.trl_names import TRL_NAMES

_COMMON: dict[str, str] = {
    "lr": "actor.lr",
    "lr_scheduler": "actor.lr_schedule (constant or cosine)",
    "lr_warmup_steps": "actor.warmup_steps",
    "lr_warmup_steps_ratio": "actor.warmup_ratio",
    "warmup": "actor.warmup_steps (or actor.warmup_ratio)",
    "per_device_train_batch_size": "data.train_batch_size (prompts per step, each sampled rollout.n times; TRL "
    "counts completions per device)",
    "train_batch_size": "data.train_batch_size (prompts per step)",
    "batch_size": "data.train_batch_size (prompts per step)",
    "rollout_batch_size": "data.train_batch_size (prompts per step)",
    "gradient_accumulation_steps": "actor.mini_batch_size (prompts per optimizer step; micro-batches fill "
    "actor.max_tokens_per_micro_batch tokens)",
    "ppo_mini_batch_size": "actor.mini_batch_size (prompts per optimizer step)",
    "micro_batch_size": "actor.max_tokens_per_micro_batch (micro-batches fill a token budget)",
    "ppo_epochs": "actor.ppo_epochs",
    "grad_clip": "actor.grad_clip",
    "clip_grad": "actor.grad_clip",
    "n_samples_per_prompt": "rollout.n",
    "num_samples": "rollout.n",
    "group_size": "rollout.n",
    "n": "rollout.n",
    "max_new_tokens": "rollout.max_tokens",
    "max_response_length": "rollout.max_tokens",
    "generate_max_len": "rollout.max_tokens",
    "prompt_max_len": "data.max_prompt_length",
    "init_kl_coef": "algorithm.kl.loss_coef (with algorithm.kl.use_loss=true) or algorithm.kl.reward_coef",
    "kl_coef": "algorithm.kl.loss_coef (with algorithm.kl.use_loss=true) or algorithm.kl.reward_coef",
    "entropy_coeff": "algorithm.entropy.coef",
    "entropy_coef": "algorithm.entropy.coef",
    "clip_ratio": "algorithm.policy_loss.clip_low (and algorithm.policy_loss.clip_high)",
    "eps_clip": "algorithm.policy_loss.clip_low (and algorithm.policy_loss.clip_high)",
    "cliprange": "algorithm.policy_loss.clip_low (and algorithm.policy_loss.clip_high)",
    "loss_agg_mode": "algorithm.policy_loss.agg_mode",
    "advantage_estimator": "algorithm.advantage.estimator",
    "adv_estimator": "algorithm.advantage.estimator",
    "gae_lambda": "algorithm.advantage.lam",
    "lambd": "algorithm.advantage.lam",
    "gamma": "algorithm.advantage.gamma",
    "model_name_or_path": "model.path",
    "pretrain": "model.path",
    "tokenizer_name_or_path": "model.tokenizer_path",
    "torch_dtype": "model.dtype",
    "bf16": "model.dtype (bfloat16)",
    "lora_r": "model.lora_rank",
    "total_training_steps": "trainer.total_steps",
    "save_freq": "trainer.save_every",
    "test_freq": "trainer.val_every",
    "eval_steps": "trainer.val_every",
}

SYNONYMS: dict[str, str] = {**_COMMON, **TRL_NAMES}
"""A peer's name for a setting → the rlloom key (with a note)."""


def synonym_hint(name: str) -> tuple[str, str] | None:
    """`(key, note)` for a peer's name of a setting (`learning_rate` → `('actor.lr', '')`), else None."""
    target = SYNONYMS.get(name)
    if target is None:
        return None
    key, _, note = target.partition(" ")
    return key, note


__all__ = ["SYNONYMS", "synonym_hint"]
