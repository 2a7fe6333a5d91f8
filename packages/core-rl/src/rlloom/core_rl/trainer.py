"""The single-controller training loop: one plain Python loop that reads like ARCHITECTURE.md's diagram.

dataloader → rollout → reward → old/ref log-probs and values → advantages → PPO epochs (with the PPO-ptx loss on
rows of its own loader, if asked) → critic update → weight sync → metrics → checkpoint → periodic validation.
The workers behind it (`PolicyWorker`, `ReferenceWorker`, `CriticWorker`, `RolloutEngine`) are in-process here
and Ray/FSDP2 groups at scale; this file does not change between the two.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from rlloom.core_rl.actor import PolicyActor, ReferencePolicy, load_causal_lm
from rlloom.core_rl.algorithms import (
    AdaptiveEntropyController,
    AdvantageInputs,
    apply_kl_in_reward,
    filter_groups_by_mean,
    filter_zero_variance_groups,
    get_advantage_estimator,
    high_entropy_token_mask,
    kl_penalty,
    make_kl_controller,
    mask_truncated_responses,
    masked_mean,
    mismatch_metrics,
    overlong_reward_penalty,
    tis_weights,
)
from rlloom.core_rl.batch import TrajectoryBatch
from rlloom.core_rl.checkpoint import load_trainer_state, rng_state, save_checkpoint, set_rng_state
from rlloom.core_rl.collection import CollectFactory, CollectFn, RewardErrorReport, score, single_turn_collector
from rlloom.core_rl.config import ConfigError, KeyedValueError, RLConfig, check_warmup
from rlloom.core_rl.config_loading import config_from_dict
from rlloom.core_rl.data import PromptLoader, Row, check_rows, limit_prompt_length
from rlloom.core_rl.ema import WeightEMA
from rlloom.core_rl.generation import SamplingParams
from rlloom.core_rl.generation_log import GenerationDump, generation_records
from rlloom.core_rl.metrics import PhaseTimer, batch_metrics, best_worst_at_n, component_means, metric_means
from rlloom.core_rl.off_policy import BackgroundRollouts, RolloutRound
from rlloom.core_rl.optim import single_optimizer_step
from rlloom.core_rl.prompt_filter import PromptFilter, prompt_ids_of
from rlloom.core_rl.protocols import RewardFn, RolloutEngine, Tracker
from rlloom.core_rl.run_folder import record_config, resume_checkpoint
from rlloom.core_rl.run_setup import RunParts, build_run, load_tokenizer, mini_batch_rows
from rlloom.core_rl.samplers import SamplerFeedback, make_sampler
from rlloom.core_rl.sft import ptx_trajectory, read_ptx_rows
from rlloom.core_rl.tokenizer_loading import check_engine_tokenizer
from rlloom.core_rl.trajectory import Trajectory
from rlloom.core_rl.weight_sync import sync_weights

EngineFactory = Callable[[nn.Module], RolloutEngine]
"""Builds the rollout engine from the actor's own module, so it samples from the weights being trained (no copy,
no per-step weight transfer); the in-process default. Only the in-process `PolicyActor` has a module to give."""


logger = logging.getLogger(__name__)


class RunFinished(SystemExit):
    """Raised when asked to resume a run that already reached `trainer.total_steps` (exit status 1)."""


class Trainer:
    """Owns the run's state; `fit()` trains from the start or from the latest checkpoint."""

    def __init__(
        self,
        config: RLConfig,
        *,
        engine: RolloutEngine | None = None,
        engine_factory: EngineFactory | None = None,
        reward_fn: RewardFn,
        train_data: Sequence[Row],
        val_data: Sequence[Row] | None = None,
        collect: CollectFn | None = None,
        collect_factory: CollectFactory | None = None,
        trackers: Sequence[Tracker] | None = None,
    ) -> None:
        if collect is not None and collect_factory is not None:
            raise ValueError(
                "give the Trainer at most one of collect= (a ready CollectFn) or collect_factory= (a callable that "
                "builds one on the trainer's engine, e.g. rlloom.agent.agent_collector(...))"
            )
        if (engine is None) == (engine_factory is None):
            raise ValueError(
                "give the Trainer exactly one of engine= (a RolloutEngine with its own weights, synced every step) "
                "or engine_factory= (a callable that builds one on the actor's module, e.g. "
                "lambda module: HFEngine(module, tokenizer))"
            )
        # the load-time cross-field checks again: a config changed after it was built (`cfg.rollout.n = 1`) skips them
        config = config_from_dict(config.model_dump(), source="the config given to Trainer")
        self.cfg = config
        self.reward_fn = reward_fn
        # every row checked before anything loads: a bad row otherwise fails at its first rollout
        own_collector = collect is not None or collect_factory is not None
        check_rows(train_data, split="train", agent_rows=own_collector)
        check_rows(val_data or [], split="validation", agent_rows=own_collector)
        self.val_data = list(val_data or [])
        self.output_dir = Path(config.trainer.output_dir)
        self.resume_from = resume_checkpoint(config, self.output_dir)
        tokenizer = None
        if config.data.max_prompt_length is not None:  # before the loader: the limit decides the steps per epoch
            tokenizer, limit = load_tokenizer(config), config.data.max_prompt_length
            drop = config.data.filter_overlong_prompts
            template = config.data.apply_chat_template_kwargs
            train_data = limit_prompt_length(
                train_data, tokenizer, limit, drop=drop, split="train", chat_template_kwargs=template
            )
            self.val_data = limit_prompt_length(
                val_data or [], tokenizer, limit, drop=drop, split="validation", chat_template_kwargs=template
            )
        if config.trainer.val_only and not self.val_data:
            dropped = " (data.filter_overlong_prompts dropped every one)" if val_data else ""
            raise ConfigError(
                f"trainer.val_only: there are no validation rows to validate on{dropped}; pass val_data= (the apps' "
                "--val-data) or set trainer.val_only=false"
            )
        sampler_cfg = config.data.sampler
        self.loader = PromptLoader(
            train_data,
            config.data.train_batch_size,
            shuffle=config.data.shuffle,
            seed=config.trainer.seed,
            drop_last=config.data.drop_last,
            sampler=make_sampler(
                sampler_cfg.class_path,
                sampler_cfg.kwargs,
                train_data,
                seed=config.trainer.seed,
                shuffle=config.data.shuffle,
            ),
        )
        # PPO-ptx: supervised/pretraining rows in a loader of their own, one batch per actor optimizer step
        self.ptx_loader = (
            PromptLoader(
                read_ptx_rows(config.data.ptx_files),
                config.data.ptx_batch_size,
                shuffle=config.data.shuffle,
                seed=config.trainer.seed,
                source="data.ptx_files",
            )
            if config.algorithm.ptx_coef > 0
            else None
        )
        self.total_steps = config.trainer.total_steps or config.trainer.total_epochs * self.loader.batches_per_epoch
        try:  # validated at load when trainer.total_steps is set; here for steps counted from epochs
            check_warmup(config, self.total_steps)
        except KeyedValueError as err:
            raise ConfigError(f"{err.key}: {err}") from None
        self.checkpoint_dir = self.output_dir / "checkpoints"
        state = load_trainer_state(self.resume_from) if self.resume_from else None
        self.step = int(state["step"]) if state else 0
        if self.step >= self.total_steps and not config.trainer.val_only:  # val_only may validate a finished run
            raise RunFinished(
                f"the run in {self.output_dir} already finished: checkpoint {self.resume_from} is at step "
                f"{self.step} of trainer.total_steps={self.total_steps}. Ask for more steps "
                f"(trainer.total_steps={self.total_steps + 100}) or use a new trainer.output_dir."
            )
        record_config(config, self.output_dir, resume_from=self.resume_from, step=self.step)
        self.reward_errors = RewardErrorReport()
        self.parts: RunParts = build_run(
            config,
            total_steps=self.total_steps,
            resume_from=self.resume_from,
            output_dir=self.output_dir,
            start_step=self.step,
            trackers=trackers,
            tokenizer=tokenizer,
        )
        trainer_cfg = config.trainer
        self.rollout_dump = (
            GenerationDump(trainer_cfg.rollout_data_dir, start_step=self.step) if trainer_cfg.rollout_data_dir else None
        )
        self.validation_dump = (
            GenerationDump(trainer_cfg.validation_data_dir, start_step=self.step)
            if trainer_cfg.validation_data_dir
            else None
        )
        shares_module = engine_factory is not None and isinstance(self.parts.actor, PolicyActor)
        if config.trainer.one_step_off_policy and shares_module:
            raise ConfigError(
                "trainer.one_step_off_policy generates the next batch while the actor trains, so the engine needs "
                "weights of its own: pass engine= (e.g. HFEngine on a separate copy of the model) instead of "
                "engine_factory=, which here samples from the very module the update is changing"
            )
        self.engine = engine if engine is not None else self._engine_on_actor(engine_factory)
        # which training step's weights the actor and the engine hold (they differ off-policy, between batches)
        self._actor_weights_step = self._engine_weights_step = self.step
        self.rollouts = BackgroundRollouts() if config.trainer.one_step_off_policy else None
        # off-policy: the loader's position before the batch in flight drew its prompts; a checkpoint saves this
        # one, so a resume generates that batch again instead of skipping its prompts
        self._loader_state_in_flight: dict[str, Any] | None = None
        source = (
            f"model.tokenizer_path={config.model.tokenizer_path}"
            if config.model.tokenizer_path
            else f"model.path={config.model.path}"
        )
        check_engine_tokenizer(self.engine, self.parts.tokenizer, source)
        _check_template_variables(config.data.apply_chat_template_kwargs, collect_factory or collect)
        if collect_factory is not None:
            collect = collect_factory(self.engine)
        self.collect = collect or single_turn_collector(self.engine, config.data.apply_chat_template_kwargs)
        self.kl_ctrl = make_kl_controller(
            config.algorithm.kl_controller,
            config.algorithm.kl_coef,
            target_kl=config.algorithm.target_kl,
            horizon=config.algorithm.kl_horizon,
        )
        algo, data = config.algorithm, config.data
        self.entropy_ctrl = (
            AdaptiveEntropyController(
                algo.entropy_coef,
                target_entropy=algo.target_entropy,
                step=algo.entropy_coef_step,
                max_coef=algo.max_entropy_coef,
            )
            if algo.adaptive_entropy
            else None
        )
        self.prompt_filter = (
            PromptFilter(
                drop_solved=data.filter_solved,
                drop_unsolved=data.filter_unsolved,
                solved_threshold=data.solved_threshold,
            )
            if data.filter_solved or data.filter_unsolved
            else None
        )
        self.sampling = SamplingParams(
            n=config.rollout.n,
            temperature=config.rollout.temperature,
            top_p=config.rollout.top_p,
            top_k=config.rollout.top_k,
            min_p=config.rollout.min_p,
            stop=list(config.rollout.stop),
            max_tokens=config.rollout.max_tokens_at(self.step),
        )
        self.ema = WeightEMA(self._policy_module(), config.trainer.ema_beta) if config.trainer.ema_beta else None
        if state:
            self._restore(state)
        else:
            _seed_everything(config.trainer.seed)

    def _engine_on_actor(self, factory: EngineFactory | None) -> RolloutEngine:
        """Call `factory` with the actor's module (built only now, by `build_run`). A sharded actor has no whole
        module here, so the engine gets its own copy of the policy, kept current by the weight sync every step."""
        actor = self.parts.actor
        if factory is None:
            raise TypeError("engine_factory is None; pass engine= or engine_factory=")
        if isinstance(actor, PolicyActor):
            module: nn.Module = actor.model
        else:
            weights = str(self.resume_from or self.cfg.model.path)
            module = load_causal_lm(self.cfg.model.model_copy(update={"lora_rank": 0}), weights, self.parts.device)
        engine = factory(module)
        if not isinstance(engine, RolloutEngine):
            raise TypeError(
                f"engine_factory returned a {type(engine).__name__}, which lacks generate/agenerate/update_weights "
                "(the RolloutEngine protocol)"
            )
        return engine

    def _sync_weights(self) -> None:
        bucket_bytes = int(self.cfg.distributed.weight_bucket_mb * 2**20)
        sync_weights(self.parts.actor, self.engine, bucket_bytes=bucket_bytes)
        self._engine_weights_step = self._actor_weights_step

    # ------------------------------------------------------------------ the loop
    def fit(self) -> dict[str, float]:
        """Train until `trainer.total_steps`; returns the last step's metrics (with `trainer.val_only`, validate
        the current weights once, log the metrics at the current step and return them, without training)."""
        cfg, tracker = self.cfg, self.parts.tracker
        tracker.log_config(cfg.model_dump(mode="json"))
        self._sync_weights()  # the engine may have loaded an older checkpoint
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
            self._refresh_engine()  # the engine ends with the final weights
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
        if self.rollouts is not None:
            trajectories, metrics = self._off_policy_batch(timer)
        else:
            trajectories, metrics = self._collect_scored(timer)
        batch = TrajectoryBatch.from_trajectories(trajectories, self.parts.pad_token_id)
        if metrics.get("dynamic_sampling/skipped_update"):
            self._dump_rollouts(trajectories, None)
            return self._step_metrics(batch, metrics, timer)

        warming = self.step <= cfg.trainer.critic_warmup  # critic-only step: the policy stays as it is
        on_policy = not warming and self._update_supplies_old_logprobs(batch)
        if not on_policy:
            with timer("old_logprobs"):
                old_logprobs, entropy = actor.compute_logprobs(
                    batch, temperature=self.sampling.temperature, entropy=True
                )
                batch["old_logprobs"] = old_logprobs
        if self.parts.reference is not None:
            with timer("ref_logprobs"):
                batch["ref_logprobs"], _ = self.parts.reference.compute_logprobs(
                    batch, temperature=self.sampling.temperature
                )
        if self.parts.critic is not None:
            with timer("values"):
                batch["values"] = self.parts.critic.compute_values(batch)
        if not on_policy:  # otherwise the update reports these from its own log-probs
            metrics.update(self._policy_diagnostics(batch, entropy))
        metrics["actor/old_logprobs_from_update"] = float(on_policy)
        entropy_coef = self._entropy_coef(metrics)

        with timer("advantages"):
            metrics.update(self._compute_advantages(batch, trajectories))
        self._dump_rollouts(trajectories, batch)
        if cfg.algorithm.overlong_filter:
            # after the advantages: truncated responses still count in their group's baseline, carry no loss
            truncated = torch.tensor([r == "length" for r in batch.non_tensors["finish_reason"]])
            batch["loss_mask"] = mask_truncated_responses(batch.loss_mask, truncated)
            metrics["overlong/filtered_frac"] = float(truncated.float().mean())
        if not warming:
            # only with PPO-ptx on, so a PolicyWorker written before `ptx_batch` existed still fits
            ptx = {"ptx_batch": self._next_ptx_batch} if self.ptx_loader is not None else {}
            with timer("update_actor"):
                metrics.update(
                    actor.update_policy(batch, temperature=self.sampling.temperature, entropy_coef=entropy_coef, **ptx)
                )
            self._actor_weights_step = self.step
            if self.ema is not None:
                self.ema.update(self._policy_module())
        metrics["actor/critic_warmup"] = float(warming)
        if self.parts.critic is not None:
            with timer("update_critic"):
                metrics.update(self.parts.critic.update_critic(batch))
        if not warming and self.rollouts is None:  # off-policy, the engine takes them once its batch is done
            with timer("weight_sync"):
                self._sync_weights()
        sync_every = cfg.algorithm.ref_model_sync_steps
        if sync_every and self.step % sync_every == 0:
            self._reference().mix_from(self._policy_module(), cfg.algorithm.ref_model_mixup_alpha)
            metrics["actor/ref_model_synced"] = 1.0
        return self._step_metrics(batch, metrics, timer)

    def _reference(self) -> ReferencePolicy:
        """The in-process reference (the config allows reference syncing only for it)."""
        reference = self.parts.reference
        if not isinstance(reference, ReferencePolicy):
            raise TypeError("algorithm.ref_model_sync_steps needs the in-process ReferencePolicy")
        return reference

    def _policy_module(self) -> nn.Module:
        actor = self.parts.actor
        if not isinstance(actor, PolicyActor):
            raise TypeError("algorithm.ref_model_sync_steps and trainer.ema_beta need the in-process PolicyActor")
        return actor.model

    def _step_metrics(self, batch: TrajectoryBatch, metrics: dict[str, float], timer: PhaseTimer) -> dict[str, float]:
        """The step's batch statistics, phase timings and throughput, added to `metrics`."""
        cfg = self.cfg
        metrics.update(batch_metrics(batch, max_response_length=self.sampling.max_tokens))
        if cfg.rollout.max_tokens_schedule:
            metrics["rollout/max_tokens"] = float(self.sampling.max_tokens)
        if self.prompt_filter is not None:
            metrics.update(self.prompt_filter.metrics(len(self.loader.active_ids)))
        sampler_metrics = getattr(self.loader.sampler, "metrics", None)
        if sampler_metrics is not None:
            metrics.update(sampler_metrics())
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
        advantages: list[float | None] | None = None
        if batch is not None:
            mask = batch.loss_mask.float()
            sampled = mask.sum(-1)
            means = (batch["advantages"].float() * mask).sum(-1) / sampled.clamp(min=1)
            advantages = [float(m) if n > 0 else None for m, n in zip(means.tolist(), sampled.tolist(), strict=True)]
        records = generation_records(
            trajectories, self.parts.tokenizer, step=self.step, split="train", advantages=advantages
        )
        self.rollout_dump.write(self.step, records)

    # ------------------------------------------------------------------ phases
    def _collect_scored(self, timer: PhaseTimer) -> tuple[list[Trajectory], dict[str, float]]:
        """Rollout + reward; with DAPO dynamic sampling, more rounds until the batch has enough useful groups."""
        algo, want = self.cfg.algorithm, self.cfg.data.train_batch_size
        kept: list[Trajectory] = []
        groups: list[str] = []
        rounds = 0
        seen_groups = 0
        metrics: dict[str, float] = {}
        errors: list[str | None] = []
        penalties: list[float] = []  # every round's, so the overlong metrics describe the whole step's sampling
        while True:
            rounds += 1
            prefix = f"s{self.step}r{rounds}"
            row_ids = self._next_prompt_ids(metrics)
            rows = [self.loader.rows[i] for i in row_ids]
            trajectories, round_errors, round_penalties = self._rollout_round(rows, self.sampling, prefix, timer)
            errors += round_errors
            if algo.overlong_buffer:
                penalties += round_penalties
                metrics.update(_overlong_metrics(penalties))
            if self.prompt_filter is not None:
                self.prompt_filter.record(
                    prompt_ids_of(trajectories, row_ids, prefix), [t.reward or 0.0 for t in trajectories]
                )
            self._feed_sampler(trajectories, row_ids, prefix)
            if not algo.dynamic_sampling:
                self.reward_errors.report(errors, step=self.step)
                return trajectories, metrics
            scores = torch.tensor([self._filter_score(t) for t in trajectories], dtype=torch.float32)
            group_ids = [t.group_id for t in trajectories]
            if algo.filter_band is not None:
                low, high = algo.filter_band
                keep = filter_groups_by_mean(scores, group_ids, low=low, high=high).tolist()
            else:
                keep = filter_zero_variance_groups(scores, group_ids).tolist()
            seen_groups += len(rows)
            for traj, ok in zip(trajectories, keep, strict=True):
                if ok:
                    if traj.group_id not in groups:
                        groups.append(traj.group_id)
                    kept.append(traj)
            if len(groups) >= want or rounds >= algo.max_sampling_rounds:
                break
        self.reward_errors.report(errors, step=self.step)
        metrics["dynamic_sampling/rounds"] = float(rounds)
        metrics["dynamic_sampling/kept_group_frac"] = len(groups) / max(seen_groups, 1)
        if not kept:
            # No group had signal: DAPO trains on none of them. An update on all-zero advantages would still move
            # the weights (AdamW's momentum and weight decay) and cost a full forward/backward, so the step only
            # logs its rollouts.
            metrics["dynamic_sampling/skipped_update"] = 1.0
            return trajectories, metrics
        wanted = set(groups[:want])
        return [t for t in kept if t.group_id in wanted], metrics

    def _rollout_round(
        self, rows: Sequence[Row], sampling: SamplingParams, prefix: str, timer: PhaseTimer
    ) -> tuple[list[Trajectory], list[str | None], list[float]]:
        """Generate and score one round: the trajectories, their scoring errors (and ReMax baselines'), and DAPO's
        overlong penalties (empty without `algorithm.overlong_buffer`). Runs on the rollout worker thread with
        `trainer.one_step_off_policy`, so it reads nothing that the update changes."""
        algo = self.cfg.algorithm
        with timer("rollout"):
            trajectories = self.collect(rows, sampling, prefix)
        penalties: list[float] = []
        with timer("reward"):
            errors = score(trajectories, self.reward_fn)
            if algo.overlong_buffer:
                penalties = self._punish_overlong(trajectories, sampling.max_tokens)
            if algo.adv_estimator == "remax":
                errors += self._greedy_baselines(rows, trajectories, prefix, sampling)
        return trajectories, errors, penalties

    def _off_policy_batch(self, timer: PhaseTimer) -> tuple[list[Trajectory], dict[str, float]]:
        """`trainer.one_step_off_policy`: take the batch generated during the previous update (or generate one now,
        at the first step), give the idle engine the current weights, and start the next step's batch."""
        rollouts = self.rollouts
        assert rollouts is not None
        if not rollouts.pending:
            rollouts.start(self._round_job(self.step))
        with timer("rollout_wait"):
            done = rollouts.take()
        self._loader_state_in_flight = None
        self.reward_errors.report(done.errors, step=self.step)
        # before the next batch is drawn: its prompts then know this batch's rewards, as on-policy
        self._feed_sampler(done.trajectories, done.row_ids, done.prefix)
        metrics = dict(done.metrics)
        if done.penalties:
            metrics.update(_overlong_metrics(done.penalties))
        metrics.update({f"timing/background_{phase}_s": s for phase, s in done.seconds.items()})
        # updates between the weights that sampled the batch and those it trains from (critic warm-up makes none)
        metrics["rollout/policy_lag"] = float(self._actor_weights_step - done.weights_step)
        self._refresh_engine()
        if self.step < self.total_steps:
            rollouts.start(self._round_job(self.step + 1))
        return done.trajectories, metrics

    def _round_job(self, step: int) -> Callable[[], RolloutRound]:
        """Step `step`'s rollout: its prompts and sampling decided here, on the main thread (the loader's order
        stays the run's), generated and scored by the returned function on the worker."""
        metrics: dict[str, float] = {}
        self._loader_state_in_flight = self.loader.state_dict()
        row_ids = self._next_prompt_ids(metrics)
        rows = [self.loader.rows[i] for i in row_ids]
        sampling = self.sampling.model_copy(update={"max_tokens": self.cfg.rollout.max_tokens_at(step)})
        weights_step = self._engine_weights_step
        prefix = f"s{step}r1"

        def job() -> RolloutRound:
            timer = PhaseTimer()
            trajectories, errors, penalties = self._rollout_round(rows, sampling, prefix, timer)
            return RolloutRound(
                trajectories, errors, penalties, timer.seconds, metrics, weights_step, row_ids=row_ids, prefix=prefix
            )

        return job

    def _refresh_engine(self) -> None:
        """Give the engine the actor's current weights if it lacks them, once no batch is being generated."""
        if self.rollouts is not None:
            self.rollouts.drain()
        if self._engine_weights_step != self._actor_weights_step:
            self._sync_weights()

    def _filter_score(self, traj: Trajectory) -> float:
        """What dynamic sampling judges a sample by: `algorithm.filter_key`'s reward component, else the task score
        (the reward without the overlong penalty, as DAPO filters on accuracy: a length penalty alone is no signal).
        A sample whose scoring failed counts as 0."""
        key = self.cfg.algorithm.filter_key
        if key is None:
            return (traj.reward or 0.0) - traj.reward_components.get("overlong_penalty", 0.0)
        if key in traj.reward_components:
            return float(traj.reward_components[key])
        if traj.reward_error is not None:
            return 0.0
        raise ConfigError(
            f"algorithm.filter_key: {key!r} is not among the reward components of a sample "
            f"({', '.join(sorted(traj.reward_components)) or 'none'}); name one of them, or set "
            "algorithm.filter_key=null to filter on the reward"
        )

    def _punish_overlong(self, trajectories: list[Trajectory], limit: int) -> list[float]:
        """DAPO's soft overlong punishment against the response limit `limit`, added to each reward and kept as the
        `overlong_penalty` component (the config refuses a buffer longer than any stage's limit); returns them."""
        algo = self.cfg.algorithm
        multi_turn = next((t for t in trajectories if t.metrics.get("turns", 1) > 1 or 0 in t.loss_mask), None)
        if multi_turn is not None:
            # a multi-turn response holds observations and several turns, each with rollout.max_tokens of its own:
            # measured against one turn's budget, nearly every conversation would be punished
            turns = multi_turn.metrics.get("turns", "?")
            raise ConfigError(
                "algorithm.overlong_buffer (DAPO's overlong punishment) measures a single-turn response against "
                f"rollout.max_tokens, but the collector returned a multi-turn trajectory ({turns} turns, observation "
                "tokens in its response); set algorithm.overlong_buffer=0 for agent training"
            )
        lengths = torch.tensor([len(t.response_ids) for t in trajectories])
        penalties = overlong_reward_penalty(
            lengths, max_length=limit, buffer_length=algo.overlong_buffer, penalty_factor=algo.overlong_penalty_factor
        ).tolist()
        for traj, penalty in zip(trajectories, penalties, strict=True):
            traj.reward = (traj.reward or 0.0) + penalty
            traj.reward_components["overlong_penalty"] = penalty
        return penalties

    def _next_prompt_ids(self, metrics: dict[str, float]) -> list[int]:
        """The next batch's row ids; at an epoch boundary, online filtering first retires the prompts the last
        epoch solved every time (and, if asked, never)."""
        if self.prompt_filter is not None and self.loader.epoch_finished:
            outcome = self.prompt_filter.end_epoch(
                num_prompts=len(self.loader.rows), min_active=self.cfg.data.train_batch_size
            )
            if outcome.skipped:
                metrics["data/filter_skipped"] = 1.0
            self.loader.exclude(self.prompt_filter.retired)
        return self.loader.next_batch_ids()

    def _feed_sampler(self, trajectories: Sequence[Trajectory], row_ids: Sequence[int], prefix: str) -> None:
        """A curriculum sampler's `update` with one rollout round's rewards, mapped to their rows (a sampler
        without `update` costs nothing here)."""
        update = getattr(self.loader.sampler, "update", None)
        if update is None:
            return
        feedback = SamplerFeedback(
            step=self.step,
            row_ids=tuple(prompt_ids_of(trajectories, row_ids, prefix)),
            rewards=tuple(t.reward or 0.0 for t in trajectories),
            components=tuple(dict(t.reward_components) for t in trajectories),
        )
        update(feedback)

    def _update_supplies_old_logprobs(self, batch: TrajectoryBatch) -> bool:
        """`algorithm.old_logprobs=auto`: skip the separate old-log-prob forward when the batch gets one optimizer
        step and nothing before the update reads the old log-probs or their entropy (KL in the reward, TIS weights,
        high-entropy token selection, adaptive entropy control); the update then uses its own, detached (ratio 1)."""
        algo, actor = self.cfg.algorithm, self.cfg.actor
        needs_old = algo.use_kl_in_reward or algo.tis_cap is not None or algo.adaptive_entropy
        if algo.old_logprobs != "auto" or needs_old or algo.top_entropy_quantile < 1.0 or self.rollouts is not None:
            return False
        rows = mini_batch_rows(self.cfg, actor.mini_batch_size)
        return single_optimizer_step(batch.batch_size, rows, epochs=actor.ppo_epochs)

    def _next_ptx_batch(self) -> TrajectoryBatch:
        """The next `data.ptx_batch_size` PPO-ptx rows as a batch; the loader's position is saved with checkpoints, so
        a resumed run continues with the rows an uninterrupted one would have drawn."""
        assert self.ptx_loader is not None
        data = self.cfg.data
        trajectories = [
            ptx_trajectory(
                self.parts.tokenizer,
                row,
                max_length=data.ptx_max_length,
                chat_template_kwargs=data.apply_chat_template_kwargs,
            )
            for row in self.ptx_loader.next_batch()
        ]
        return TrajectoryBatch.from_trajectories(trajectories, self.parts.pad_token_id)

    def _entropy_coef(self, metrics: dict[str, float]) -> float:
        """This step's entropy-bonus weight: `algorithm.entropy_coef`, or Skywork-OR1's adaptive rule applied to the
        entropy just measured on the batch (then the controller moves for the next step)."""
        if self.entropy_ctrl is None:
            return self.cfg.algorithm.entropy_coef
        if "actor/entropy" not in metrics:
            raise RuntimeError(
                "algorithm.adaptive_entropy needs the policy entropy, but the actor's compute_logprobs(entropy=True) "
                "returned none; use a PolicyWorker that computes entropies or switch adaptive_entropy off"
            )
        entropy = metrics["actor/entropy"]
        applied = self.entropy_ctrl.coef_for(entropy)
        metrics["actor/entropy_coef"] = self.entropy_ctrl.value
        metrics["actor/entropy_coef_applied"] = applied
        self.entropy_ctrl.update(entropy)
        return applied

    def _greedy_baselines(
        self, rows: Sequence[Row], trajectories: list[Trajectory], prefix: str, sampling: SamplingParams
    ) -> list[str | None]:
        """ReMax: score one greedy response per prompt; its reward is the baseline of the prompt's samples.
        Returns the baselines' scoring errors."""
        greedy = sampling.model_copy(update={"n": 1, "temperature": 0.0})
        baselines = self.collect(rows, greedy, prefix)
        errors = score(baselines, self.reward_fn)
        by_group = {t.group_id: t.reward for t in baselines}
        for traj in trajectories:
            traj.extra_info["remax_baseline"] = by_group[traj.group_id]
        return errors

    def _policy_diagnostics(self, batch: TrajectoryBatch, entropy: torch.Tensor | None) -> dict[str, float]:
        """Entropy, KL to the reference, and the rollout/trainer mismatch (TIS weights when enabled)."""
        mask, algo = batch.loss_mask, self.cfg.algorithm
        out: dict[str, float] = {}
        if entropy is not None:
            out["actor/entropy"] = float(masked_mean(entropy, mask))
        if "ref_logprobs" in batch:
            kl = kl_penalty(batch["old_logprobs"], batch["ref_logprobs"], algo.kl_loss_type)
            out["actor/kl_mean"] = float(masked_mean(kl, mask))
        if "rollout_logprobs" in batch:
            mismatch = mismatch_metrics(
                batch["old_logprobs"], batch["rollout_logprobs"], mask, cap=algo.tis_cap, mode=algo.tis_mode
            )
            out.update({f"mismatch/{k}": float(v) for k, v in mismatch.items()})
            if algo.tis_cap is not None:
                batch["is_weights"] = tis_weights(
                    batch["old_logprobs"], batch["rollout_logprobs"], mask, cap=algo.tis_cap, mode=algo.tis_mode
                )
        if algo.top_entropy_quantile < 1.0:
            if entropy is None:
                raise RuntimeError("algorithm.top_entropy_quantile needs the old-log-prob pass's entropy")
            # the selected tokens' per-token weight is kept (1, or the TIS weight); the others' becomes 0, so they
            # still count in the loss's token normaliser, as in TRL
            keep = high_entropy_token_mask(entropy, mask, top_fraction=algo.top_entropy_quantile)
            base = batch["is_weights"] if "is_weights" in batch else mask.float()
            batch["is_weights"] = base * keep.float()
            out["actor/high_entropy_token_frac"] = float(masked_mean(keep.float(), mask))
        return out

    def _compute_advantages(self, batch: TrajectoryBatch, trajectories: list[Trajectory]) -> dict[str, float]:
        """Outcome reward on each response's last sampled token, KL-in-reward if asked, then the estimator."""
        algo, mask = self.cfg.algorithm, batch.loss_mask
        token_rewards = outcome_token_rewards(batch["scores"], mask)
        out: dict[str, float] = {}
        if algo.use_kl_in_reward:
            token_rewards, current_kl = apply_kl_in_reward(
                token_rewards, batch["old_logprobs"], batch["ref_logprobs"], mask, self.kl_ctrl.value,
                algo.kl_in_reward_type,
            )  # fmt: skip
            out["kl_in_reward/kl"] = float(current_kl)
            out["kl_in_reward/coef"] = self.kl_ctrl.value
            self.kl_ctrl.update(float(current_kl), n_steps=batch.batch_size)
        batch["token_rewards"] = token_rewards
        baselines = None
        if algo.adv_estimator == "remax":
            baselines = torch.tensor([t.extra_info["remax_baseline"] for t in trajectories], dtype=torch.float32)
        inputs = AdvantageInputs(
            token_rewards=token_rewards,
            mask=mask,
            group_ids=batch.non_tensors["group_id"],
            values=batch.tensors.get("values"),
            baseline_scores=baselines,
            gamma=algo.gamma,
            lam=algo.lam,
            norm_by_std=algo.norm_adv_by_std,
            std_scope=algo.adv_std_scope,
        )
        batch["advantages"], batch["returns"] = get_advantage_estimator(algo.adv_estimator)(inputs)
        return out

    def validate(self) -> dict[str, float]:
        """Score the validation prompts (greedy by default) without disturbing the training RNG streams."""
        rollout = self.cfg.rollout
        update: dict[str, Any] = {"n": rollout.val_n, "temperature": rollout.val_temperature}
        if rollout.val_top_p is not None:
            update["top_p"] = rollout.val_top_p
        sampling = self.sampling.model_copy(update=update)
        self._refresh_engine()  # off-policy, a batch may be in flight with older weights
        py_state, np_state = random.getstate(), np.random.get_state()
        with torch.random.fork_rng(devices=[]):
            trajectories = self.collect(self.val_data, sampling, f"val{self.step}")
            errors = score(trajectories, self.reward_fn)
        random.setstate(py_state)
        np.random.set_state(np_state)
        self.reward_errors.report(errors, step=self.step, split="validation")
        shown = self.cfg.trainer.log_val_generations
        if self.validation_dump is not None or shown:
            records = generation_records(trajectories, self.parts.tokenizer, step=self.step, split="validation")
            if self.validation_dump is not None:
                self.validation_dump.write(self.step, records)
            if shown:
                # the first samples: the same validation rows every time, so the table shows how answers change
                self.parts.tracker.log_generations(records[:shown], self.step, title="val/generations")
        rewards = torch.tensor([t.reward or 0.0 for t in trajectories])
        out = {"val/reward/mean": float(rewards.mean())}
        for source in sorted({t.data_source for t in trajectories}):
            picked = [t for t in trajectories if t.data_source == source]
            name = f"val/reward/{source or 'default'}"
            out[f"{name}/mean"] = sum(t.reward or 0.0 for t in picked) / len(picked)
            out.update(best_worst_at_n([t.reward or 0.0 for t in picked], [t.group_id for t in picked], name))
        out.update(component_means([t.reward_components for t in trajectories], prefix="val/"))
        out["val/response_length/mean"] = sum(len(t.response_ids) for t in trajectories) / len(trajectories)
        out.update({f"val/rollout/{k}": v for k, v in metric_means([t.metrics for t in trajectories]).items()})
        return out

    # ------------------------------------------------------------------ checkpoints
    def save(self) -> Path:
        parts = self.parts

        def write_model(path: Path) -> None:
            parts.actor.save_pretrained(str(path))
            parts.tokenizer.save_pretrained(str(path))
            if self.ema is not None:  # the averaged policy, loadable like the model itself
                with self.ema.applied(self._policy_module()):
                    parts.actor.save_pretrained(str(path / EMA_DIR))
                parts.tokenizer.save_pretrained(str(path / EMA_DIR))
            if parts.critic is not None:
                parts.critic.save_pretrained(str(path / "critic"))

        state: dict[str, Any] = {
            "step": self.step,
            "actor": parts.actor.state_dict(),
            "critic": parts.critic.state_dict() if parts.critic is not None else None,
            "loader": self._loader_state_in_flight or self.loader.state_dict(),
            "ptx_loader": self.ptx_loader.state_dict() if self.ptx_loader is not None else None,
            "kl_controller": self.kl_ctrl.state_dict(),
            "entropy_controller": self.entropy_ctrl.state_dict() if self.entropy_ctrl is not None else None,
            "prompt_filter": self.prompt_filter.state_dict() if self.prompt_filter is not None else None,
            # a reference that moves with the policy (ref_model_sync_steps) is no longer model.path's weights
            "reference": self._reference().model.state_dict() if self.cfg.algorithm.ref_model_sync_steps else None,
            "ema": self.ema.state_dict() if self.ema is not None else None,
            "rng": rng_state(),
        }
        return save_checkpoint(
            self.checkpoint_dir,
            self.step,
            write_model=write_model,
            trainer_state=state,
            config_yaml=self.cfg.to_yaml(),
            keep_last=self.cfg.trainer.keep_last,
        )

    def _restore(self, state: Mapping[str, Any]) -> None:
        self.parts.actor.load_state_dict(state["actor"])
        if self.parts.critic is not None:
            if state.get("critic") is None:
                raise ConfigError(
                    f"{self.resume_from} has no critic state but algorithm.adv_estimator=gae trains a critic; resume "
                    "with the checkpoint's own algorithm.adv_estimator, or start a new run in a new trainer.output_dir"
                )
            self.parts.critic.load_state_dict(state["critic"])
        if self.ema is not None and state.get("ema") is not None:
            self.ema.load_state_dict(state["ema"])
        if self.cfg.algorithm.ref_model_sync_steps and state.get("reference") is not None:
            self._reference().model.load_state_dict(state["reference"])
        self.loader.load_state_dict(state["loader"])
        if self.ptx_loader is not None and state.get("ptx_loader") is not None:
            self.ptx_loader.load_state_dict(state["ptx_loader"])
        self.kl_ctrl.load_state_dict(state["kl_controller"])
        # a checkpoint of a run without these options leaves them at their configured start
        if self.entropy_ctrl is not None and state.get("entropy_controller") is not None:
            self.entropy_ctrl.load_state_dict(state["entropy_controller"])
        if self.prompt_filter is not None and state.get("prompt_filter") is not None:
            self.prompt_filter.load_state_dict(state["prompt_filter"])
        if self.prompt_filter is None:
            self.loader.excluded = frozenset()  # filtering switched off on resume: retired prompts come back
        set_rng_state(state["rng"])


EMA_DIR = "ema"
"""Where a checkpoint keeps the averaged policy (`trainer.ema_beta`), beside the model's own files."""


def outcome_token_rewards(scores: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """`[B, R]` rewards: each score on its response's last sampled token (0 for a response with none)."""
    positions = torch.arange(1, loss_mask.shape[1] + 1, device=loss_mask.device)
    last = (loss_mask * positions).argmax(-1)
    rewards = torch.zeros(loss_mask.shape, dtype=torch.float32, device=loss_mask.device)
    has_tokens = loss_mask.bool().any(-1)
    rows = torch.arange(loss_mask.shape[0], device=loss_mask.device)
    rewards[rows[has_tokens], last[has_tokens]] = scores[has_tokens].float()
    return rewards


def _overlong_metrics(penalties: Sequence[float]) -> dict[str, float]:
    """Mean soft overlong penalty and penalised share over every sample the step drew (all sampling rounds)."""
    count = max(len(penalties), 1)
    return {
        "overlong/penalty_mean": sum(penalties) / count,
        "overlong/penalised_frac": sum(p < 0 for p in penalties) / count,
    }


def _check_template_variables(wanted: Mapping[str, Any], collector: Any) -> None:
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


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def train(
    config: RLConfig,
    *,
    engine: RolloutEngine | None = None,
    engine_factory: EngineFactory | None = None,
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
