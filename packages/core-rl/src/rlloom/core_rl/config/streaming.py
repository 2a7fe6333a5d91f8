"""Settings of fully asynchronous RL (issue 42): `trainer.mode`, `trainer.streaming` (bounded staleness, groups in
flight, partial rollouts) and `algorithm.off_policy_correction` (decoupled PPO or truncated IS against the behaviour
policy), with the refusals of combinations that cannot work. What they do is in docs/async_rl.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field, field_validator

from rlloom.core_rl.config.keys import KeyedValueError
from rlloom.core_rl.config.section import Section

if TYPE_CHECKING:
    from rlloom.core_rl.config.schema import RLConfig

TrainerMode = Literal["sync", "one_step_off", "async"]


class StreamingConfig(Section):
    """`trainer.mode=async`: generators run continuously and stream finished groups into a buffer."""

    max_staleness: int = Field(
        default=1,
        ge=0,
        description="AReaL's eta (Fu et al. 2025): a new group starts only while groups started <= (trainer version "
        "+ max_staleness + 1) x data.train_batch_size, and a step waits for any group started max_staleness+1 "
        "versions ago, so no trained token is more than max_staleness updates old; nothing is dropped for being "
        "slow. 0 gives the synchronous trainer's results.",
    )
    max_groups_in_flight: int | None = Field(
        default=None,
        ge=1,
        description="Groups generated at once at most; None = no limit beyond max_staleness's admission rule.",
    )
    partial_rollout: Literal["off", "keep_kv", "reprefill"] = Field(
        default="off",
        description="Requests in progress across a weight update. An InflightWeightUpdate engine always pauses, "
        "takes the weights and resumes them, keeping their KV cache or re-prefilling them as its own inflight_kv "
        "setting says (HFEngineConfig / VLLMEngineConfig / VLLMServerConfig): off takes the engine's choice, "
        "keep_kv insists that it keeps its KV cache, reprefill that it re-prefills (the engine rollout.engine builds "
        "takes its setting from this key). On any other engine: off, "
        "the update waits for the requests in progress; reprefill, each response is generated in chunks of "
        "chunk_tokens, each continued as a prompt under the weights current when it starts, and the update waits "
        "only for the chunks in progress (single-turn collection); keep_kv is refused.",
    )
    chunk_tokens: int = Field(
        default=64, ge=1, description="Tokens per chunk with partial_rollout=reprefill (the update's longest wait)."
    )

    @field_validator("partial_rollout", mode="before")
    @classmethod
    def _yaml_off(cls, value: object) -> object:
        """YAML reads a bare `off` (`partial_rollout: off`, `...partial_rollout=off`) as the boolean False."""
        return "off" if value is False else value


class OffPolicyCorrectionConfig(Section):
    """How the loss corrects for samples drawn by older weights (the behaviour policy, `rollout_logprobs`)."""

    method: Literal["none", "tis", "decoupled"] = Field(
        default="none",
        description="none: the PPO ratio against the recomputed old log-probs only. tis: each token weighted by "
        "min(pi_prox/pi_behav, cap) (truncated IS, Yao et al. 2025). decoupled: AReaL's decoupled PPO (Fu et al. "
        "2025): the clipped ratio against the proximal policy (the log-probs recomputed before the update), each "
        "token weighted by pi_prox/pi_behav, and tokens whose weight exceeds the cap dropped (weight 0).",
    )
    cap: float = Field(default=5.0, gt=0.0, description="The cap of pi_prox/pi_behav (AReaL's behav_imp_weight_cap).")


def check_modes(cfg: RLConfig) -> None:
    """Refuse what `trainer.mode` and its sections cannot run with, naming the key."""
    algo, trainer = cfg.algorithm, cfg.trainer
    if trainer.streaming is not None and trainer.mode != "async":
        raise KeyedValueError(
            "trainer.streaming",
            f"is set but trainer.mode={trainer.mode}; its settings (max_staleness, partial_rollout ...) apply only to "
            "trainer.mode=async: set trainer.mode=async or trainer.streaming=null",
        )
    # algorithm.dynamic_sampling runs in every mode but async at max_staleness 0: it needs only the rewards of the
    # batch being sampled, and the one-step-off worker and the async generator score what they sample
    if trainer.mode != "sync" and (cfg.data.filter_solved or cfg.data.filter_unsolved):
        name = "trainer.one_step_off_policy" if trainer.mode == "one_step_off" else "trainer.mode"
        raise KeyedValueError(
            name,
            f"{'async ' if trainer.mode == 'async' else ''}cannot run with data.filter_solved/unsolved: they decide "
            "the next prompts from this step's rewards, which the batches generated in the background have not "
            "seen; switch one of them off",
        )
    if trainer.mode == "async" and algo.dynamic_sampling is not None and streaming_settings(cfg).max_staleness == 0:
        raise KeyedValueError(
            "trainer.streaming.max_staleness",
            "is 0 with algorithm.dynamic_sampling: at 0 a whole batch of prompts is one generation call, as the "
            "synchronous trainer makes it, and a dropped group cannot be replaced without breaking the bound; use "
            "trainer.mode=sync (the same run), trainer.mode=one_step_off or max_staleness >= 1",
        )
    correction = algo.off_policy_correction
    if correction is not None and correction.method != "none" and algo.tis is not None:
        raise KeyedValueError(
            "algorithm.off_policy_correction",
            f"method={correction.method} and algorithm.tis both weight every token by pi_old/pi_rollout; keep one "
            "(algorithm.tis=null, or algorithm.off_policy_correction=null)",
        )


def streaming_settings(cfg: RLConfig) -> StreamingConfig:
    """`trainer.streaming`, or its defaults when `trainer.mode=async` leaves it out."""
    return cfg.trainer.streaming if cfg.trainer.streaming is not None else StreamingConfig()


__all__ = ["OffPolicyCorrectionConfig", "StreamingConfig", "TrainerMode", "check_modes", "streaming_settings"]
