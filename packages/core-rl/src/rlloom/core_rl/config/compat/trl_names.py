"""TRL `GRPOConfig` field names and where each lives here: a hint in the unknown-key error (TRL's names are flat,
so `learning_rate=1e-6` on the command line is refused with `actor.lr` named), and a column of
docs/config_names.md. Values of TRL names whose meaning differs say so."""

from __future__ import annotations

TRL_NAMES: dict[str, str] = {
    "learning_rate": "actor.lr",
    "weight_decay": "actor.weight_decay",
    "adam_beta1": "actor.betas (a pair)",
    "adam_beta2": "actor.betas (a pair)",
    "max_grad_norm": "actor.grad_clip",
    "warmup_ratio": "actor.warmup_ratio",
    "warmup_steps": "actor.warmup_steps",
    "lr_scheduler_type": "actor.lr_schedule (constant or cosine)",
    "num_iterations": "actor.ppo_epochs",
    "gradient_checkpointing": "model.gradient_checkpointing",
    "num_generations": "rollout.n",
    "max_completion_length": "rollout.max_tokens",
    "max_prompt_length": "data.max_prompt_length",
    "temperature": "rollout.temperature",
    "top_p": "rollout.top_p",
    "top_k": "rollout.top_k",
    "min_p": "rollout.min_p",
    "beta": "algorithm.kl.loss_coef (with algorithm.kl.use_loss=true; TRL's beta=0 is algorithm.kl.use_loss=false)",
    "epsilon": "algorithm.policy_loss.clip_low",
    "epsilon_high": "algorithm.policy_loss.clip_high",
    "loss_type": "algorithm.policy_loss.agg_mode (TRL grpo = seq-mean-token-mean, dapo = token-mean, dr_grpo = "
    "seq-mean-token-sum-norm, bnpo = bnpo)",
    "scale_rewards": "algorithm.advantage.norm_by_std (TRL 'batch' = algorithm.advantage.std_scope=batch)",
    "importance_sampling_level": "algorithm.policy_loss.name (TRL 'sequence' = gspo)",
    "mask_truncated_completions": "algorithm.overlong_filter",
    "top_entropy_quantile": "algorithm.top_entropy_quantile",
    "sync_ref_model": "algorithm.ref_sync (a section: {every: N})",
    "ref_model_sync_steps": "algorithm.ref_sync.every",
    "ref_model_mixup_alpha": "algorithm.ref_sync.alpha",
    "max_steps": "trainer.total_steps",
    "num_train_epochs": "trainer.total_epochs",
    "output_dir": "trainer.output_dir",
    "save_steps": "trainer.save_every",
    "save_total_limit": "trainer.keep_last",
    "eval_steps": "trainer.val_every",
    "report_to": "trainer.trackers",
    "run_name": "trainer.run_name",
    "seed": "trainer.seed",
}
"""TRL's `GRPOConfig` field → ours (or what to do instead)."""
