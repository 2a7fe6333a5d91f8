"""The single-controller training loop, top to bottom as in ARCHITECTURE.md's diagram: prompts → rollout → reward →
old/ref log-probs and values → token weights → advantages → PPO epochs (PPO-ptx if asked) → critic update → weight
sync → metrics → checkpoint → validation. Phases live in `phases/`, construction in `run/builder.py`, checkpointed
state in the `RunState` registry; the workers behind it are in-process here and Ray/FSDP2 groups at scale.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from rlloom.core_rl.algorithms import mask_truncated_responses
from rlloom.core_rl.config.schema import ConfigError, RLConfig
from rlloom.core_rl.contracts.batch import TrajectoryBatch
from rlloom.core_rl.contracts.protocols import EngineFactory, EngineSource, RewardFn, Tracker
from rlloom.core_rl.contracts.trajectory import Trajectory
from rlloom.core_rl.data.loader import PromptLoader, Row
from rlloom.core_rl.data.prompt_filter import PromptFilter
from rlloom.core_rl.data.ptx import next_ptx_batch
from rlloom.core_rl.observe.generation_log import generation_records, record_validation
from rlloom.core_rl.observe.metrics import PhaseTimer, batch_metrics, mean_advantages, validation_metrics
from rlloom.core_rl.phases.advantages import compute_advantages
from rlloom.core_rl.phases.collection import CollectFactory, CollectFn, GuardedReward, RewardErrorReport, score
from rlloom.core_rl.phases.controllers import EntropyBonus, kl_controller
from rlloom.core_rl.phases.dynamic_sampling import StepBatch, collect_step_batch
from rlloom.core_rl.phases.prompt_source import PromptSource
from rlloom.core_rl.phases.reward_shaping import outcome_token_rewards
from rlloom.core_rl.phases.rollout_round import RoundRunner
from rlloom.core_rl.phases.token_weights import old_logprobs_read_before_update, policy_diagnostics, set_token_weights
from rlloom.core_rl.run import builder as setup
from rlloom.core_rl.run.builder import RunFinished, RunParts, build_run
from rlloom.core_rl.run.checkpoint import load_trainer_state, rng_state, save_checkpoint, set_rng_state
from rlloom.core_rl.run.folder import record_config, resume_checkpoint
from rlloom.core_rl.run.sharded_checkpoint import ShardedWorker, load_worker_state, shards_path, worker_state
from rlloom.core_rl.run.state import RunState
from rlloom.core_rl.streaming.rollouts import background_rollouts, validation_rng, validation_seed
from rlloom.core_rl.workers.actor import PolicyActor, ReferencePolicy
from rlloom.core_rl.workers.ema import WeightEMA
from rlloom.core_rl.workers.optim import single_optimizer_step
from rlloom.core_rl.workers.weight_sync import EngineWeights

__all__ = ["EMA_DIR", "EngineFactory", "RunFinished", "Trainer", "outcome_token_rewards", "train"]

EMA_DIR = "ema"
"""Where a checkpoint keeps the averaged policy (`trainer.ema_beta`), beside the model's own files."""


class Trainer:
    """Owns the run's state; `fit()` trains from the start or from the latest checkpoint."""

    def __init__(
        self,
        config: RLConfig,
        *,
        engine: EngineSource | None = None,
        engine_factory: EngineFactory | None = None,  # deprecated: engine= takes a factory
        reward_fn: RewardFn,
        train_data: Sequence[Row],
        val_data: Sequence[Row] | None = None,
        collect: CollectFn | None = None,
        collect_factory: CollectFactory | None = None,
        trackers: Sequence[Tracker] | None = None,
    ) -> None:
        self.cfg = cfg = setup.checked_config(config, engine, engine_factory, collect, collect_factory)
        self.reward_fn = GuardedReward(reward_fn, cfg.trainer.reward_timeout_s)
        own_collector = collect is not None or collect_factory is not None
        data = setup.prepare_data(cfg, train_data, val_data, own_collector=own_collector)
        self.val_data = data.val
        self.output_dir = Path(cfg.trainer.output_dir)
        self.checkpoint_dir = self.output_dir / "checkpoints"
        self.resume_from = resume_checkpoint(cfg, self.output_dir)
        self.prompts = PromptSource(
            setup.prompt_loader(cfg, data.train), setup.prompt_filter(cfg), min_active=cfg.data.train_batch_size
        )
        self.ptx_loader = setup.ptx_loader(cfg)
        self.total_steps = setup.total_training_steps(cfg, self.loader)
        state = load_trainer_state(self.resume_from) if self.resume_from else None
        self.step = setup.start_step(cfg, state, self.total_steps, str(self.resume_from))
        record_config(cfg, self.output_dir, resume_from=self.resume_from, step=self.step)
        self.reward_errors = RewardErrorReport()
        self.parts: RunParts = build_run(
            cfg,
            total_steps=self.total_steps,
            resume_from=self.resume_from,
            output_dir=self.output_dir,
            start_step=self.step,
            trackers=trackers,
            tokenizer=data.tokenizer,
        )
        self.rollout_dump, self.validation_dump = setup.generation_dumps(cfg.trainer, self.step)
        self.engine = setup.build_engine(cfg, self.parts, engine, engine_factory, self.resume_from)
        collector = setup.build_collector(cfg, self.engine, collect, collect_factory)
        self.rounds = RoundRunner(collector, self.reward_fn, cfg.algorithm)
        self.kl_ctrl = kl_controller(cfg.algorithm)
        self.entropy = EntropyBonus(cfg.algorithm)
        self.sampling = setup.sampling_params(cfg, self.step)
        self.ema = WeightEMA(self._policy_module(), cfg.trainer.ema_beta) if cfg.trainer.ema_beta else None
        bucket_bytes = cfg.distributed.weight_bucket_bytes
        self.weights = EngineWeights(self.parts.actor, self.engine, bucket_bytes=bucket_bytes, step=self.step)
        self.rollouts = background_rollouts(
            cfg, self.prompts, self.rounds, engine=self.engine, weights=self.weights, reward_errors=self.reward_errors,
            custom_collector=own_collector, start_step=self.step, total_steps=self.total_steps,
        )  # fmt: skip
        self.state = self._register_state()
        if state:
            self.state.load_state_dict(state)
        else:
            setup.seed_everything(cfg.trainer.seed)

    @property
    def loader(self) -> PromptLoader:
        return self.prompts.loader

    @property
    def prompt_filter(self) -> PromptFilter | None:
        return self.prompts.prompt_filter

    # ------------------------------------------------------------------ the loop
    def fit(self) -> dict[str, float]:
        """Train until `trainer.total_steps`; returns the last step's metrics (with `trainer.val_only`, validate
        the current weights once, log the metrics at the current step and return them, without training)."""
        cfg, tracker = self.cfg, self.parts.tracker
        tracker.log_config(cfg.model_dump(mode="json"))
        self.weights.sync()  # the engine may have loaded an older checkpoint
        if cfg.trainer.val_before_train and self.step == 0 and self.val_data and not cfg.trainer.val_only:
            tracker.log(self.validate(), step=0)
        metrics: dict[str, float] = {}
        try:
            if cfg.trainer.val_only:  # no training rollout, no update, no checkpoint
                metrics = self.validate()
                tracker.log(metrics, step=self.step)
                return metrics
            while self.step < self.total_steps:
                self.step += 1
                metrics = self.train_step()
                tracker.log(metrics, step=self.step)
                last = self.step == self.total_steps
                # validation before the checkpoint: a run killed between the two then redoes the step from the
                # previous checkpoint; the other way round, a kill after the last save lost that step's validation
                # for good (a resume finds the run finished)
                if self.val_data and cfg.trainer.val_every and (last or self.step % cfg.trainer.val_every == 0):
                    val = self.validate()
                    tracker.log(val, step=self.step)
                    metrics.update(val)
                if last or (cfg.trainer.save_every and self.step % cfg.trainer.save_every == 0):
                    self.save()
            self.weights.refresh()  # the engine ends with the final weights
        finally:
            if self.rollouts is not None:
                self.rollouts.close()
            tracker.close()
        return metrics

    def train_step(self) -> dict[str, float]:
        """One step of rollout → reward → log-probs/values → advantages → updates → weight sync."""
        cfg, actor, timer = self.cfg, self.parts.actor, PhaseTimer()
        # multi-stage context length: this step's limit (constant without rollout.max_tokens_schedule)
        self.sampling = self.sampling.model_copy(update={"max_tokens": cfg.rollout.max_tokens_at(self.step)})
        drawn = self._step_batch(timer)
        trajectories, metrics = drawn.trajectories, drawn.metrics
        batch = TrajectoryBatch.from_trajectories(trajectories, self.parts.pad_token_id)
        if drawn.skipped_update:
            self._dump_rollouts(trajectories, None)
            return self._step_metrics(batch, metrics, timer)

        warming = self.step <= cfg.trainer.critic_warmup  # critic-only step: the policy stays as it is
        on_policy = not warming and self._update_supplies_old_logprobs(batch)
        temperature = self.sampling.temperature
        if not on_policy:
            with timer("old_logprobs"):
                batch["old_logprobs"], entropy = actor.compute_logprobs(batch, temperature=temperature, entropy=True)
        if self.parts.reference is not None:
            with timer("ref_logprobs"):
                batch["ref_logprobs"], _ = self.parts.reference.compute_logprobs(batch, temperature=temperature)
        if self.parts.critic is not None:
            with timer("values"):
                batch["values"] = self.parts.critic.compute_values(batch)
        if not on_policy:  # otherwise the update reports these from its own log-probs
            metrics.update(policy_diagnostics(batch, entropy, cfg.algorithm))
            metrics.update(set_token_weights(batch, entropy, cfg.algorithm))
        metrics["actor/old_logprobs_from_update"] = float(on_policy)
        entropy_coef = self.entropy.coef(metrics)

        with timer("advantages"):
            metrics.update(compute_advantages(batch, trajectories, cfg.algorithm, self.kl_ctrl))
        self._dump_rollouts(trajectories, batch)
        if cfg.algorithm.overlong_filter:
            # after the advantages: truncated responses still count in their group's baseline, carry no loss
            truncated = torch.tensor([r == "length" for r in batch.non_tensors["finish_reason"]])
            batch["loss_mask"] = mask_truncated_responses(batch.loss_mask, truncated)
            metrics["overlong/filtered_frac"] = float(truncated.float().mean())
        if not warming:
            # only with PPO-ptx on, so a PolicyWorker written before `ptx_batch` existed still fits
            ptx = {"ptx_batch": self._next_ptx_batch} if self.ptx_loader is not None else {}
            if self.rollouts is None:  # colocated: an engine with sleep mode frees its memory for the update
                self.weights.release_memory()
            with timer("update_actor"):
                metrics.update(actor.update_policy(batch, temperature=temperature, entropy_coef=entropy_coef, **ptx))
            self.weights.actor_step = self.step
            if self.ema is not None:
                self.ema.update(self._policy_module())
        metrics["actor/critic_warmup"] = float(warming)
        if self.parts.critic is not None:
            with timer("update_critic"):
                metrics.update(self.parts.critic.update_critic(batch))
        if not warming and self.rollouts is None:  # off-policy, the engine takes them once its batch is done
            with timer("weight_sync"):
                self.weights.sync()
        ref_sync = cfg.algorithm.ref_sync
        if ref_sync is not None and self.step % ref_sync.every == 0:
            self._reference().mix_from(self._policy_module(), ref_sync.alpha)
            metrics["actor/ref_model_synced"] = 1.0
        return self._step_metrics(batch, metrics, timer)

    def _step_batch(self, timer: PhaseTimer) -> StepBatch:
        """The trajectories this step trains on: generated during the previous update (one-step off-policy), or
        now, with DAPO's dynamic sampling if asked."""
        if self.rollouts is not None:
            return self.rollouts.next_batch(
                self.step, total_steps=self.total_steps, sampling=self.sampling, timer=timer
            )
        return collect_step_batch(
            self.prompts,
            self.rounds,
            self.cfg.algorithm,
            step=self.step,
            sampling=self.sampling,
            batch_size=self.cfg.data.train_batch_size,
            reward_errors=self.reward_errors,
            timer=timer,
        )

    def _update_supplies_old_logprobs(self, batch: TrajectoryBatch) -> bool:
        """`algorithm.old_logprobs=auto`: skip the separate old-log-prob forward when the batch gets one optimizer
        step and nothing before the update reads the old log-probs or their entropy (`OLD_LOGPROB_READERS`); the
        update then uses its own, detached (ratio 1). Off-policy batches always need the separate forward."""
        algo, actor = self.cfg.algorithm, self.cfg.actor
        off_policy = self.rollouts is not None and not self.rollouts.on_policy
        if algo.old_logprobs != "auto" or old_logprobs_read_before_update(algo) or off_policy:
            return False
        return single_optimizer_step(batch.batch_size, self.cfg.mini_batch_rows("actor"), epochs=actor.ppo_epochs)

    def _next_ptx_batch(self) -> TrajectoryBatch:
        assert self.ptx_loader is not None
        ptx, template = self.cfg.algorithm.ptx, self.cfg.data.apply_chat_template_kwargs
        assert ptx is not None
        return next_ptx_batch(self.ptx_loader, self.parts.tokenizer, self.parts.pad_token_id, ptx, template)

    def _step_metrics(self, batch: TrajectoryBatch, metrics: dict[str, float], timer: PhaseTimer) -> dict[str, float]:
        """The step's batch statistics, phase timings and throughput, added to `metrics`."""
        metrics.update(batch_metrics(batch, max_response_length=self.sampling.max_tokens))
        if self.cfg.rollout.max_tokens_schedule:
            metrics["rollout/max_tokens"] = float(self.sampling.max_tokens)
        metrics.update(self.prompts.metrics())
        metrics.update(timer.metrics())
        tokens = float(batch["attention_mask"].sum())
        metrics["perf/tokens_per_s"] = tokens / max(metrics["timing/step_s"], 1e-9)
        metrics["train/epoch"] = float(self.loader.epoch)
        return metrics

    def _dump_rollouts(self, trajectories: list[Trajectory], batch: TrajectoryBatch | None) -> None:
        """`trainer.rollout_data_dir`: the step's trajectories with each one's mean advantage over its sampled
        tokens (`batch` holds the advantages; None when the step computed none)."""
        if self.rollout_dump is None:
            return
        advantages = mean_advantages(batch) if batch is not None else None
        records = generation_records(
            trajectories, self.parts.tokenizer, step=self.step, split="train", advantages=advantages
        )
        self.rollout_dump.write(self.step, records)

    def _reference(self) -> ReferencePolicy:
        """The in-process reference (the config allows reference syncing only for it)."""
        reference = self.parts.reference
        if not isinstance(reference, ReferencePolicy):
            raise TypeError("algorithm.ref_sync needs the in-process ReferencePolicy")
        return reference

    def _policy_module(self) -> nn.Module:
        actor = self.parts.actor
        if not isinstance(actor, PolicyActor):
            raise TypeError("algorithm.ref_sync and trainer.ema_beta need the in-process PolicyActor")
        return actor.model

    # ------------------------------------------------------------------ validation
    def validate(self) -> dict[str, float]:
        """Score the validation prompts (greedy by default) without disturbing the training RNG streams; beside the
        async generator thread, sampled validation is seeded by trainer.seed instead (`validation_rng`)."""
        rollout = self.cfg.rollout
        update: dict[str, Any] = {"n": rollout.val_n, "temperature": rollout.val_temperature}
        update |= validation_seed(self.rollouts, self.cfg.trainer.seed)
        if rollout.val_top_p is not None:
            update["top_p"] = rollout.val_top_p
        sampling = self.sampling.model_copy(update=update)
        self.weights.refresh()  # off-policy, a batch may be in flight with older weights
        with validation_rng(self.rollouts):
            trajectories = self.rounds.collect(self.val_data, sampling, f"val{self.step}")
            errors = score(trajectories, self.reward_fn)
        self.reward_errors.report(errors, step=self.step, split="validation")
        shown, dump, tracker = self.cfg.trainer.log_val_generations, self.validation_dump, self.parts.tracker
        record_validation(trajectories, self.parts.tokenizer, self.step, dump=dump, tracker=tracker, shown=shown)
        return validation_metrics(trajectories)

    # ------------------------------------------------------------------ checkpoints
    def _register_state(self) -> RunState:
        """Every stateful part of the run, under the checkpoint keys rlloom has always written, in restore order
        (the RNG streams last). A part this run does not have is saved as None."""
        state, parts, moving_reference = RunState(), self.parts, self.cfg.algorithm.ref_sync is not None
        state.register("step", lambda: self.step, lambda _saved: None)  # read by setup.start_step, before any part
        actor, checkpoint = parts.actor, self.resume_from
        state.register("actor", lambda: worker_state(actor), lambda saved: load_worker_state(actor, saved, checkpoint))
        state.register("critic", self._critic_state, self._load_critic, load_none=parts.critic is not None)
        state.register_part("ema", self.ema)
        # a reference that moves with the policy is no longer model.path's weights
        state.register_part("reference", self._reference().model if moving_reference else None)
        rollouts, loader = self.rollouts, self.loader
        save_loader, load_loader = (rollouts.loader_state, rollouts.load_loader_state) if rollouts else (
            loader.state_dict, loader.load_state_dict)  # fmt: skip
        state.register("loader", save_loader, load_loader)
        state.register_part("ptx_loader", self.ptx_loader)
        state.register_part("kl_controller", self.kl_ctrl)
        state.register_part("entropy_controller", self.entropy)
        filtering = self.prompt_filter
        save_filter = filtering.state_dict if filtering is not None else lambda: None
        state.register("prompt_filter", save_filter, self.prompts.load_filter_state, load_none=True)
        state.register("rng", rng_state, set_rng_state)
        return state

    def _critic_state(self) -> dict[str, Any] | None:
        return worker_state(self.parts.critic) if self.parts.critic is not None else None

    def _load_critic(self, saved: Any) -> None:
        if self.parts.critic is None:
            return
        if saved is None:
            raise ConfigError(
                f"{self.resume_from} has no critic state but algorithm.advantage.estimator=gae trains a critic; "
                "resume with the checkpoint's own algorithm.advantage.estimator, or start a new run in a new "
                "trainer.output_dir"
            )
        load_worker_state(self.parts.critic, saved, self.resume_from)

    def save(self) -> Path:
        parts = self.parts

        def write_model(path: Path) -> None:
            # ranks write their own shards (no HF weights: `export_hf` makes them); one process writes HF weights
            if isinstance(parts.actor, ShardedWorker):
                parts.actor.save_shards(str(shards_path(path, "actor")))
            else:
                parts.actor.save_pretrained(str(path))
            parts.tokenizer.save_pretrained(str(path))
            if self.ema is not None:  # the averaged policy, loadable like the model itself
                with self.ema.applied(self._policy_module()):
                    parts.actor.save_pretrained(str(path / EMA_DIR))
                parts.tokenizer.save_pretrained(str(path / EMA_DIR))
            if isinstance(parts.critic, ShardedWorker):
                parts.critic.save_shards(str(shards_path(path, "critic")))
            elif parts.critic is not None:
                parts.critic.save_pretrained(str(path / "critic"))

        return save_checkpoint(
            self.checkpoint_dir,
            self.step,
            write_model=write_model,
            trainer_state=self.state.state_dict(),
            config_yaml=self.cfg.to_yaml(),
            keep_last=self.cfg.trainer.keep_last,
        )


def train(
    config: RLConfig,
    *,
    engine: EngineSource | None = None,
    engine_factory: EngineFactory | None = None,  # deprecated: engine= takes a factory
    reward_fn: RewardFn,
    train_data: Sequence[Row],
    val_data: Sequence[Row] | None = None,
    collect: CollectFn | None = None,
    collect_factory: CollectFactory | None = None,
    trackers: Sequence[Tracker] | None = None,
) -> dict[str, float]:
    """Build a `Trainer` and run it; the entry point apps call. Returns the last step's metrics."""
    trainer = Trainer(
        config,
        engine=engine,
        engine_factory=engine_factory,
        reward_fn=reward_fn,
        train_data=train_data,
        val_data=val_data,
        collect=collect,
        collect_factory=collect_factory,
        trackers=trackers,
    )
    return trainer.fit()
