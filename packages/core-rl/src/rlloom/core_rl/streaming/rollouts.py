"""The trainer's side of `trainer.mode=async`: build the generator, take each step's batch from the buffer,
push the weights in flight, and save/restore where the prompts stand.

Resume: a checkpoint saves the loader's position before the oldest draw that still has an untrained group, which
positions of that draw and later ones were trained, and the finished groups not yet trained (`persist`); a resume
draws the same rows again, puts the saved groups back into the buffer and skips both, so only the groups in
flight at the save are generated again, none lost, none trained twice.
"""

from __future__ import annotations

import logging
import time
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from rlloom.core_rl.config.schema import ConfigError, RLConfig
from rlloom.core_rl.config.streaming import streaming_settings
from rlloom.core_rl.contracts.engines import InflightWeightUpdate, RolloutEngine
from rlloom.core_rl.contracts.generation import SamplingParams
from rlloom.core_rl.contracts.trajectory import Trajectory
from rlloom.core_rl.observe.metrics import PhaseTimer
from rlloom.core_rl.phases.collection import RewardErrorReport
from rlloom.core_rl.phases.dynamic_sampling import StepBatch, kept_samples
from rlloom.core_rl.phases.off_policy import OffPolicyRollouts
from rlloom.core_rl.phases.prompt_source import PromptSource
from rlloom.core_rl.phases.reward_shaping import overlong_metrics
from rlloom.core_rl.phases.rollout_round import RoundRunner
from rlloom.core_rl.run.checkpoint import preserved_rng
from rlloom.core_rl.streaming.buffer import Group, GroupBuffer
from rlloom.core_rl.streaming.calls import LoopGenerate, streamed_collector
from rlloom.core_rl.streaming.chunked import chunked_collector
from rlloom.core_rl.streaming.gate import UpdateGate, push_guard
from rlloom.core_rl.streaming.generator import StreamingGenerator
from rlloom.core_rl.streaming.persist import group_state, restored_group
from rlloom.core_rl.streaming.staleness import staleness_metrics
from rlloom.core_rl.workers.weight_sync import EngineWeights

logger = logging.getLogger(__name__)


class AsyncRollouts:
    """Batches for `Trainer.train_step` from the continuously running generator."""

    on_policy = False

    def __init__(
        self,
        cfg: RLConfig,
        prompts: PromptSource,
        rounds: RoundRunner,
        *,
        engine: RolloutEngine,
        weights: EngineWeights,
        reward_errors: RewardErrorReport,
        custom_collector: bool,
        start_step: int,
        total_steps: int,
    ) -> None:
        streaming = streaming_settings(cfg)
        self.batch_size = cfg.data.train_batch_size
        self.prompts, self.weights, self.reward_errors = prompts, weights, reward_errors
        self.on_policy = streaming.max_staleness == 0  # the batch is sampled by the weights it trains from
        self.max_staleness = streaming.max_staleness
        inflight = isinstance(engine, InflightWeightUpdate)
        keeps_kv = isinstance(engine, InflightWeightUpdate) and engine.keeps_kv_cache
        if streaming.partial_rollout == "keep_kv" and not keeps_kv:
            raise ConfigError(
                "trainer.streaming.partial_rollout: keep_kv needs an engine that keeps its KV cache across an "
                f"in-flight weight update (InflightWeightUpdate with keeps_kv_cache); {type(engine).__name__} has "
                "none: use partial_rollout=reprefill (any engine) or off"
            )
        if streaming.partial_rollout == "reprefill" and keeps_kv:
            raise ConfigError(
                "trainer.streaming.partial_rollout: reprefill asks that requests in progress be re-prefilled under "
                f"the new weights, but {type(engine).__name__} keeps their KV cache across an in-flight update "
                "(keeps_kv_cache); set the engine's inflight_kv setting (HFEngineConfig / VLLMEngineConfig / "
                "VLLMServerConfig), e.g. HFEngineConfig(inflight_kv='reprefill'), or use partial_rollout=keep_kv "
                "or off"
            )
        if self.max_staleness > 0 and cfg.algorithm.off_policy_correction is None:
            logger.warning(
                "trainer.mode=async with max_staleness=%d trains samples up to that many updates old without a "
                "correction; algorithm.off_policy_correction.method=decoupled (AReaL's) kept the learning per sample "
                "within noise of sync in bench/async_agent_vllm.py, and none fell behind (docs/async_rl.md)",
                self.max_staleness,
            )
        self.gate = UpdateGate()
        streamed = LoopGenerate(engine)
        chunked = streaming.partial_rollout == "reprefill" and not inflight
        if not chunked and not custom_collector and streaming.max_staleness > 0:
            # groups share the engine's continuous batch (at eta 0 a whole batch is one call, as sync makes it)
            collect_streamed = streamed_collector(streamed, cfg.data.apply_chat_template_kwargs)
            rounds = RoundRunner(collect_streamed, rounds.reward_fn, rounds.algorithm)
        if chunked:
            if custom_collector:
                raise ConfigError(
                    "trainer.streaming.partial_rollout: reprefill chunks single-turn requests, but this run has its "
                    "own collector (collect=/collect_factory=, e.g. an agent); use an InflightWeightUpdate engine "
                    "or partial_rollout=off"
                )
            collect = chunked_collector(
                engine,
                streamed,
                self.gate,
                lambda: weights.engine_step,
                chunk_tokens=streaming.chunk_tokens,
                chat_template_kwargs=cfg.data.apply_chat_template_kwargs,
            )
            rounds = RoundRunner(collect, rounds.reward_fn, rounds.algorithm)
        # partial_rollout=off on an engine that cannot update in flight: a push waits for the requests in progress
        generating = self.gate.reading if not (inflight or chunked) else None
        self.buffer = GroupBuffer()
        self.generator = StreamingGenerator(
            prompts,
            rounds,
            streaming,
            self.buffer,
            batch_size=self.batch_size,
            version=lambda: weights.engine_step,
            total_groups=total_steps * self.batch_size,
            started=start_step * self.batch_size,
            first_draw=start_step + 1,
            **({"generating": generating} if generating is not None else {}),
        )
        self.generator.max_tokens_at = cfg.rollout.max_tokens_at
        self.dynamic = cfg.algorithm.dynamic_sampling
        if self.dynamic is not None:  # the same budget per batch as sync's max_rounds rounds of a batch each
            self.generator.dynamic = self.dynamic
            self.generator.drop_budget = (self.dynamic.max_rounds - 1) * self.batch_size
        self.generator.on_loop = streamed
        self.trained: dict[int, set[int]] = {}  # draw → positions trained, for draws the checkpoint may resume in
        weights.guard = push_guard(engine, self.gate, lambda: weights.actor_step, self.generator.wake)
        self._idle_seen = 0.0

    def next_batch(self, step: int, *, total_steps: int, sampling: SamplingParams, timer: PhaseTimer) -> StepBatch:
        """Push the last update's weights in flight, then take the `train_batch_size` oldest finished groups,
        waiting for any group that would otherwise become staler than max_staleness."""
        del total_steps  # the generator knows how many groups the run trains
        with timer("weight_sync"):
            self.weights.refresh()
        self.generator.sampling = sampling
        self.generator.consumed = step - 1
        self.generator.start()  # once; later calls do nothing
        self.generator.wake()
        started = time.monotonic()
        with timer("rollout_wait"):
            # step t trains from version t-1: a group started at version t-1-eta or earlier must be in this batch,
            # or it would train at a staleness above eta later
            groups, ready = self.buffer.take(self.batch_size, oldest_version=step - self.max_staleness)
        waited = time.monotonic() - started
        dropped = self.buffer.take_dropped()
        trajectories = [t for g in groups for t in g.trajectories]
        self.reward_errors.report([e for g in [*groups, *dropped] for e in g.errors], step=step)
        self._record(step, [*groups, *dropped])
        metrics = dict(self.generator.metrics)
        self.generator.metrics.clear()
        if self.dynamic is not None:
            metrics.update(self._dynamic_metrics(groups, dropped))
        penalties = [p for g in groups for p in g.penalties]
        if penalties:
            metrics.update(overlong_metrics(penalties))
        metrics.update(staleness_metrics(trajectories, trainer_version=self.weights.actor_step))
        finished, in_flight = self.buffer.counts()
        idle = self.generator.idle_s
        metrics.update(
            {
                "async/buffer_fill": ready / self.batch_size,
                "async/groups_in_flight": float(in_flight),
                "async/groups_waiting": float(finished),
                "async/generator_idle_s": idle - self._idle_seen,
                "async/trainer_wait_s": waited,
            }
        )
        self._idle_seen = idle
        return StepBatch(trajectories, metrics)

    def _dynamic_metrics(self, groups: list[Group], dropped: list[Group]) -> dict[str, float]:
        """Sync's `dynamic_sampling/kept_group_frac` (groups with signal / groups finished for this batch), the
        groups dropped, and those trained without signal because the drop budget was spent."""
        assert self.dynamic is not None
        signal = sum(all(kept_samples(g.trajectories, self.dynamic)) for g in groups)
        return {
            "dynamic_sampling/kept_group_frac": signal / max(len(groups) + len(dropped), 1),
            "dynamic_sampling/dropped_groups": float(len(dropped)),
            "dynamic_sampling/unfiltered_groups": float(len(groups) - signal),
        }

    def _record(self, step: int, groups: list[Group]) -> None:
        """Feed the rewards to the prompt source (curriculum samplers), one call per collect call; note what was
        trained (or dropped by dynamic sampling) for the checkpoint."""
        calls: dict[str, tuple[list[int], list[Trajectory]]] = {}
        for group in groups:
            calls.setdefault(group.record_prefix, (group.record_rows, []))[1].extend(group.trajectories)
            self.trained.setdefault(group.draw, set()).add(group.position)
        for prefix, (rows, trajectories) in calls.items():
            self.prompts.record(step, trajectories, rows, prefix)
        with self.generator.lock:
            for number, draw in list(self.generator.draw_log.items()):
                if len(self.trained.get(number, ())) == len(draw.row_ids):
                    del self.generator.draw_log[number]
                    self.trained.pop(number, None)

    # ----------------------------------------------------------------- checkpoints
    def loader_state(self) -> dict[str, Any]:
        """The loader's position before the oldest draw with an untrained group, what was trained since, and the
        finished groups waiting to be trained (a group finishing during the save counts as in flight)."""
        finished = [group_state(g) for g in self.buffer.waiting()]
        with self.generator.lock:
            if not self.generator.draw_log:
                loader, first, trained = self.prompts.loader.state_dict(), self.generator.next_draw, {}
            else:
                first = min(self.generator.draw_log)
                loader = self.generator.draw_log[first].loader_state
                used = {d: set(p) for d, p in self.trained.items()}
                for group in self.buffer.dropped_waiting():  # their rows are spent, as a trained group's
                    used.setdefault(group.draw, set()).add(group.position)
                trained = {str(d): sorted(p) for d, p in used.items() if d >= first}
        return {"loader": loader, "async_draw": first, "trained": trained, "finished": finished}

    def load_loader_state(self, state: dict[str, Any]) -> None:
        """Restore the loader and the saved finished groups; a checkpoint written before groups were saved (no
        `finished`) regenerates them."""
        if "async_draw" not in state:  # a checkpoint of a synchronous run
            self.prompts.loader.load_state_dict(state)
            return
        self.prompts.loader.load_state_dict(state["loader"])
        self.generator.next_draw = int(state["async_draw"])
        self.trained = {int(d): set(p) for d, p in state.get("trained", {}).items()}
        skips = {d: set(p) for d, p in self.trained.items()}
        first = self.generator.next_index  # groups trained before the save; the saved ones were admitted next
        restored = [restored_group(g, first + i) for i, g in enumerate(state.get("finished", []))]
        for group in restored:
            skips.setdefault(group.draw, set()).add(group.position)
            self.buffer.finished(group)
        self.generator.skips = skips
        self.generator.started += len(restored)
        self.generator.next_index += len(restored)
        self.generator.metrics["async/groups_restored"] = float(len(restored))

    def drain(self) -> None:
        """Nothing to wait for: the engine takes weights in flight."""

    def close(self) -> None:
        self.generator.stop()


def generator_beside(rollouts: OffPolicyRollouts | AsyncRollouts | None) -> bool:
    """Whether the async generator thread samples while validation runs (max_staleness > 0)."""
    return isinstance(rollouts, AsyncRollouts) and not rollouts.on_policy


def validation_seed(rollouts: OffPolicyRollouts | AsyncRollouts | None, seed: int) -> dict[str, int]:
    """The sampling seed validation adds beside the generator thread (`{"seed": trainer.seed}`), else none: sync,
    one-step-off and eta 0 keep their unseeded draws from the restored RNG, so their validation figures stay as they
    were."""
    return {"seed": seed} if generator_beside(rollouts) else {}


def validation_rng(rollouts: OffPolicyRollouts | AsyncRollouts | None) -> AbstractContextManager[Any]:
    """What validation runs under: `preserved_rng` (the training streams stay where they were), except while the
    async generator thread samples beside it (max_staleness > 0). Restoring the global RNG state there would rewind
    the generator's own draws, and the state validation starts from depends on thread timing; validation relies on
    its seeded sampling parameters instead (an engine that ignores `SamplingParams.seed` is not repeatable there)."""
    return nullcontext() if generator_beside(rollouts) else preserved_rng()


def background_rollouts(
    cfg: RLConfig,
    prompts: PromptSource,
    rounds: RoundRunner,
    *,
    engine: RolloutEngine,
    weights: EngineWeights,
    reward_errors: RewardErrorReport,
    custom_collector: bool,
    start_step: int,
    total_steps: int,
) -> OffPolicyRollouts | AsyncRollouts | None:
    """What generates the batches besides the trainer's own step, by `trainer.mode` (sync: nothing)."""
    if cfg.trainer.mode == "one_step_off":
        return OffPolicyRollouts(prompts, rounds, cfg.rollout, reward_errors, weights)
    if cfg.trainer.mode == "async":
        return AsyncRollouts(
            cfg,
            prompts,
            rounds,
            engine=engine,
            weights=weights,
            reward_errors=reward_errors,
            custom_collector=custom_collector,
            start_step=start_step,
            total_steps=total_steps,
        )
    return None


__all__ = ["AsyncRollouts", "background_rollouts", "generator_beside", "validation_rng", "validation_seed"]
