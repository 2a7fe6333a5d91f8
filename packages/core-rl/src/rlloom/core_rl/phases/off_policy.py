"""One-step off-policy training: the next batch is generated while the trainer updates on this one.

Synchronous RL leaves the generator idle during the update and the trainer idle during generation. veRL's
`one_step_off_policy` recipe (and AReaL/PipelineRL further) overlap them: the batch trained at step t was
sampled with the weights of step t − 2 while step t − 1 trained, so each step costs about max(generation,
update) instead of their sum, at the price of a policy lag of one step (the PPO ratio and TIS correct for it).
`BackgroundRollouts` holds that one batch in flight on a worker thread; the trainer decides what it generates
and when the engine's weights may change (only between batches). With DAPO's dynamic sampling the worker runs the
synchronous trainer's rounds itself (`dynamic_sampling.sample_rounds`): it scores each round, keeps the groups with
signal and draws more rows until the batch is full or `max_rounds` is reached, every round under the weights the
batch started with. The loader is then advanced on the worker, while the main thread only trains; a checkpoint
saves its position before the batch in flight, so a resume draws and generates that batch again, and the rows of
dropped groups of batches already taken lie behind that position: used, as a trained row's.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from rlloom.core_rl.config.schema import RolloutConfig
from rlloom.core_rl.contracts.generation import SamplingParams
from rlloom.core_rl.observe.metrics import PhaseTimer
from rlloom.core_rl.phases.collection import RewardErrorReport
from rlloom.core_rl.phases.dynamic_sampling import SampledRound, StepBatch, record_rounds, sample_rounds
from rlloom.core_rl.phases.prompt_source import PromptSource
from rlloom.core_rl.phases.rollout_round import RoundRunner
from rlloom.core_rl.workers.weight_sync import EngineWeights


@dataclass(slots=True)
class RolloutRound:
    """A generated and scored batch (all its dynamic-sampling rounds), with what the main thread logs and reports
    about it."""

    batch: StepBatch  # the trajectories to train on and the sampling metrics (dynamic sampling, overlong)
    errors: list[str | None]
    rounds: list[SampledRound]  # every round's rows and trajectories, for the prompt source, in draw order
    seconds: dict[str, float] = field(default_factory=dict)  # time the worker spent per phase
    weights_step: int = 0  # the training step whose weights the engine sampled with


class BackgroundRollouts:
    """At most one rollout batch in flight on a worker thread."""

    def __init__(self) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rlloom-rollout")
        self._pending: Future[RolloutRound] | None = None

    @property
    def pending(self) -> bool:
        return self._pending is not None

    def start(self, job: Callable[[], RolloutRound]) -> None:
        if self._pending is not None:
            raise RuntimeError("a rollout batch is already in flight; take() it first")
        self._pending = self._executor.submit(job)

    def take(self) -> RolloutRound:
        """The batch in flight, once finished (its worker's exception, if it failed)."""
        if self._pending is None:
            raise RuntimeError("no rollout batch in flight")
        pending, self._pending = self._pending, None
        return pending.result()

    def drain(self) -> None:
        """Wait until the batch in flight (if any) is finished, keeping it for `take()`: the engine is then idle
        and its weights may change."""
        if self._pending is not None:
            self._pending.exception()  # waits; a failure surfaces at take()

    def close(self) -> None:
        """Finish the batch in flight (its result is dropped) and stop the worker."""
        self.drain()
        self._pending = None
        self._executor.shutdown(wait=True)


class OffPolicyRollouts:
    """The trainer's side of one-step off-policy: which batch the step trains on, and which it starts next.

    The engine's weights may change only between batches, so `weights.refresh()` waits for the batch in flight
    before it syncs; the step whose weights sampled a batch is recorded when it starts, for the policy lag.
    """

    on_policy = False  # every batch trains one update after the weights that sampled it

    def __init__(
        self,
        prompts: PromptSource,
        rounds: RoundRunner,
        rollout: RolloutConfig,
        reward_errors: RewardErrorReport,
        weights: EngineWeights,
    ) -> None:
        self.prompts = prompts
        self.rounds = rounds
        self.rollout = rollout
        self.reward_errors = reward_errors
        self.weights = weights
        self.background = BackgroundRollouts()
        weights.wait_idle = self.drain
        # the loader's position before the batch in flight drew its prompts; a checkpoint saves this one, so a
        # resume generates that batch again instead of skipping its prompts
        self.loader_state_in_flight: dict[str, Any] | None = None

    def next_batch(
        self,
        step: int,
        *,
        total_steps: int,
        sampling: SamplingParams,
        timer: PhaseTimer,
    ) -> StepBatch:
        """Take the batch generated during the previous update (or generate one now, at the first step), give the
        idle engine the current weights, and start the next step's batch."""
        if not self.background.pending:
            self.background.start(self._round_job(step, sampling))
        with timer("rollout_wait"):
            done = self.background.take()
        self.loader_state_in_flight = None
        self.reward_errors.report(done.errors, step=step)
        # before the next batch is drawn: its prompts then know this batch's rewards, as on-policy
        record_rounds(self.prompts, step, done.rounds)
        metrics = dict(done.batch.metrics)
        metrics.update({f"timing/background_{phase}_s": s for phase, s in done.seconds.items()})
        # updates between the weights that sampled the batch and those it trains from (critic warm-up makes none)
        metrics["rollout/policy_lag"] = float(self.weights.actor_step - done.weights_step)
        self.weights.refresh()
        if step < total_steps:
            self.background.start(self._round_job(step + 1, sampling))
        return StepBatch(done.batch.trajectories, metrics)

    def _round_job(self, step: int, sampling: SamplingParams) -> Callable[[], RolloutRound]:
        """Step `step`'s rollout: its first round's prompts and its sampling decided here, on the main thread (the
        loader's order stays the run's), generated and scored by the returned function on the worker, which also
        draws and runs dynamic sampling's further rounds (the main thread leaves the loader alone meanwhile)."""
        metrics: dict[str, float] = {}
        self.loader_state_in_flight = self.prompts.loader.state_dict()
        first_ids = self.prompts.next_ids(metrics)
        sampling = sampling.model_copy(update={"max_tokens": self.rollout.max_tokens_at(step)})
        weights_step = self.weights.engine_step
        algorithm, batch_size = self.rounds.algorithm, self.prompts.loader.batch_size

        def job() -> RolloutRound:
            timer = PhaseTimer()
            sampled = sample_rounds(
                self.prompts,
                self.rounds,
                algorithm,
                step=step,
                sampling=sampling,
                batch_size=batch_size,
                timer=timer,
                first_ids=first_ids,
                metrics=metrics,
                record=False,
            )
            return RolloutRound(sampled.batch, sampled.errors, sampled.rounds, timer.seconds, weights_step)

        return job

    def loader_state(self) -> dict[str, Any]:
        """What a checkpoint saves as the loader's position: before the batch in flight, if one is."""
        return self.loader_state_in_flight or self.prompts.loader.state_dict()

    def load_loader_state(self, state: dict[str, Any]) -> None:
        self.prompts.loader.load_state_dict(state)

    def drain(self) -> None:
        self.background.drain()

    def close(self) -> None:
        self.background.close()
