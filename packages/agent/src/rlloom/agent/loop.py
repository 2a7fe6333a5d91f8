"""`AgentLoop`: many multi-turn conversations at once, token-in/token-out, into trainer-ready trajectories.

Each conversation is one asyncio task: generate a turn (the engine batches concurrent requests), let the
environment act on it (tool calls and retrieval overlap with other conversations' generation), append the
observation, repeat until the environment is done or a limit is hit. The engine is always given token ids,
never text, and every sampled token goes into the trajectory unchanged; see `conversation.py` for the mask.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator
from tqdm.auto import tqdm

from rlloom.agent.conversation import ConversationTokens
from rlloom.agent.environment import Environment, Sample, step_takes_last_turn
from rlloom.agent.turns import TurnTemplate
from rlloom.core_rl.contracts.batch import TrajectoryBatch
from rlloom.core_rl.contracts.engines import HasContextWindow, HasEosTokens
from rlloom.core_rl.contracts.generation import GenerationRequest, SamplingParams, check_chat_template_kwargs
from rlloom.core_rl.contracts.protocols import RolloutEngine
from rlloom.core_rl.contracts.trajectory import Trajectory
from rlloom.core_rl.observe.metrics import metric_means

FINISH_REASONS = ("stop", "length", "max_turns")
"""stop: the environment ended the episode; length: the last model turn was cut by a token limit
(max_tokens_per_turn or max_total_tokens), or no room is left for the next turn; max_turns: turn budget spent.
A cut last turn is 'length' even when the environment said done on it or it was the last allowed turn
(overlong filtering and masking rely on 'length' meaning "the response was truncated")."""


class AgentLoopConfig(BaseModel):
    """Limits and sampling of a multi-turn rollout (Search-R1's defaults where it has one)."""

    model_config = ConfigDict(extra="forbid")

    max_turns: int = Field(default=5, ge=1, description="Model turns per conversation at most (finish 'max_turns').")
    max_tokens_per_turn: int = Field(default=500, ge=1, description="New tokens per model turn (Search-R1: 500).")
    max_total_tokens: int = Field(
        default=4096,
        ge=2,
        description="Prompt + response tokens at most; reaching it ends with finish 'length'. Never more than the "
        "engine's `context_window` when it has one (HFEngine: the model's max_position_embeddings).",
    )
    max_obs_tokens: int | None = Field(
        default=500,
        ge=1,
        description="Tokens of one observation's content at most, summed over its messages (each tool result of a "
        "turn gets a fair share); Search-R1: 500; None: no cap.",
    )
    truncation_marker: str = Field(
        default=" ...[truncated]", description="Appended to an observation cut by max_obs_tokens (within the cap)."
    )
    max_concurrency: int = Field(default=512, ge=1, description="Conversations in flight at once.")
    sampling: SamplingParams = Field(
        default_factory=SamplingParams,
        description="Per-turn sampling; `n` and `max_tokens` are set by the loop, `stop` is extended by the env's, "
        "and `include_stop_str_in_output` is always on (the env reads the stop string its action ends with).",
    )
    chat_template_kwargs: dict[str, Any] = Field(
        default_factory=dict,
        description="Extra chat-template variables for the prompt and every turn's glue, e.g. {enable_thinking: "
        "false} for Qwen3 (data.apply_chat_template_kwargs in single-turn training).",
    )
    compute_reward: bool = Field(default=True, description="Call the environment's reward hook on each trajectory.")
    progress: bool = Field(
        default=False,
        description="Show a progress bar over finished conversations, with the model turns taken so far beside it "
        "(so it moves before the first conversation ends).",
    )

    @field_validator("chat_template_kwargs")
    @classmethod
    def _template_variables_only(cls, value: dict[str, Any]) -> dict[str, Any]:
        check_chat_template_kwargs(value, "AgentLoopConfig.chat_template_kwargs")
        return value


class AgentLoop:
    """Runs environments against a rollout engine and returns one `Trajectory` per conversation."""

    def __init__(
        self,
        engine: RolloutEngine,
        tokenizer: Any,
        make_env: Callable[[], Environment],
        config: AgentLoopConfig | None = None,
    ) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.make_env = make_env
        self.config = config or AgentLoopConfig()
        eos = sorted(engine.eos_token_ids or ()) if isinstance(engine, HasEosTokens) else None
        self.template = TurnTemplate(tokenizer, eos, self.config.chat_template_kwargs)
        window = engine.context_window if isinstance(engine, HasContextWindow) else None
        # a conversation that outgrew the model would make the engine refuse its next prompt (and fail the run)
        self.max_total_tokens = min(self.config.max_total_tokens, window) if window else self.config.max_total_tokens
        self._marker = self.template.encode(self.config.truncation_marker)
        if self.config.max_obs_tokens is not None and len(self._marker) > self.config.max_obs_tokens:
            raise ValueError(
                f"AgentLoopConfig.truncation_marker is {len(self._marker)} tokens, more than max_obs_tokens="
                f"{self.config.max_obs_tokens}; shorten the marker"
            )

    def run(
        self, samples: Sequence[Sample | Mapping[str, Any]], n: int = 1, group_prefix: str | None = None
    ) -> list[Trajectory]:
        """Blocking `arun` for scripts; inside a running event loop (Jupyter, async code) use `await arun(...)`."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(self.arun(samples, n, group_prefix))
        raise RuntimeError(
            "AgentLoop.run() was called inside a running event loop (Jupyter, or async code); "
            "use `await loop.arun(samples, n)` there instead"
        )

    async def arun(
        self, samples: Sequence[Sample | Mapping[str, Any]], n: int = 1, group_prefix: str | None = None
    ) -> list[Trajectory]:
        """`n` conversations per sample (a group each), all concurrently; results follow `samples` order.

        Sample i's group id is `{group_prefix}-{i}` (the trainer's naming), or a fresh random id without a prefix.
        """
        if n < 1:
            raise ValueError(f"AgentLoop.arun: n must be >= 1, got {n}")
        parsed = [s if isinstance(s, Sample) else Sample.from_row(s) for s in samples]
        limit = asyncio.Semaphore(self.config.max_concurrency)
        bar = tqdm(total=len(parsed) * n, desc="agent rollouts", disable=not self.config.progress)
        results: list[Trajectory | None] = [None] * (len(parsed) * n)
        turns = [0]

        def turn_taken() -> None:
            turns[0] += 1
            bar.set_postfix_str(f"{turns[0]} turns", refresh=True)

        async def one(index: int, sample: Sample, group_id: str) -> None:
            where = f"AgentLoop: in conversation {index} (sample {index // n}: {_describe(sample)})"
            try:
                async with limit:
                    results[index] = await self.rollout(
                        sample, group_id=group_id, seed_offset=index, on_turn=turn_taken
                    )
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    raise  # the run itself is being cancelled (another conversation failed, or the caller)
                # an env, tool or engine raised CancelledError of its own: the TaskGroup would drop this
                # conversation without a word, leaving its group short
                error = RuntimeError(
                    "the conversation was cancelled from inside (its environment, a tool or the engine raised "
                    "asyncio.CancelledError); turn such cancellations into errors or observations there"
                )
                error.add_note(where)
                raise error from None
            except Exception as exc:
                exc.add_note(where)
                raise
            bar.update(1)

        try:
            async with asyncio.TaskGroup() as tasks:
                for i, sample in enumerate(parsed):
                    group_id = f"{group_prefix}-{i}" if group_prefix is not None else uuid.uuid4().hex
                    for j in range(n):
                        tasks.create_task(one(i * n + j, sample, group_id))
        except ExceptionGroup as group:  # the cause, not asyncio's "unhandled errors in a TaskGroup" wrapper
            first = group.exceptions[0]
            if len(group.exceptions) > 1:
                first.add_note(f"AgentLoop: {len(group.exceptions)} conversations failed; this is the first")
            raise first from None
        finally:
            bar.close()
        return [t for t in results if t is not None]

    async def rollout(
        self,
        sample: Sample,
        *,
        group_id: str = "",
        seed_offset: int = 0,
        on_turn: Callable[[], None] | None = None,
    ) -> Trajectory:
        """One conversation from reset to finish (and reward); `on_turn` is called after each model turn."""
        cfg = self.config
        start = time.perf_counter()
        env = self.make_env()
        prompt_ids = self.template.prompt_ids(env.reset(sample))
        if len(prompt_ids) >= self.max_total_tokens:
            raise ValueError(
                f"{_describe(sample)}: the prompt has {len(prompt_ids)} tokens but a conversation may hold "
                f"{self.max_total_tokens} in all (AgentLoopConfig.max_total_tokens={cfg.max_total_tokens}, capped by "
                "the engine's context window); raise max_total_tokens above the longest prompt plus room for the "
                "answers, or drop/shorten this prompt"
            )
        conv = ConversationTokens(prompt_ids, self.max_total_tokens)
        metrics = {"turns": 0.0, "gen_latency_s": 0.0, "env_latency_s": 0.0, "obs_truncated": 0.0}
        stop = list(dict.fromkeys([*cfg.sampling.stop, *env.stop]))
        takes_last_turn = step_takes_last_turn(env)
        finish = "max_turns"
        for turn in range(cfg.max_turns):
            budget = min(cfg.max_tokens_per_turn, conv.remaining)
            # the env must read the stop string the trajectory holds (`</search>` is the action); vLLM-style
            # configs default it off, which made every search an invalid action
            update: dict[str, Any] = {"n": 1, "max_tokens": budget, "stop": stop, "include_stop_str_in_output": True}
            if cfg.sampling.seed is not None:
                update["seed"] = cfg.sampling.seed + 1_000_003 * seed_offset + turn
            request = GenerationRequest(prompt_ids=conv.context, sampling=cfg.sampling.model_copy(update=update))
            t0 = time.perf_counter()
            completion = (await self.engine.agenerate(request))[0]
            metrics["gen_latency_s"] += time.perf_counter() - t0
            if not completion.token_ids:  # budget >= 1, so a real engine returns at least one sampled id
                raise ValueError(
                    f"the engine returned a turn with no token ids (text {completion.text[:60]!r}); the conversation "
                    "is built from sampled ids, so without them the model's turns would be missing from its own "
                    "context and from the trajectory. Hosted OpenAI APIs return none: serve the policy with vLLM or "
                    "`rlloom-rollout serve` (both return `token_ids`), or use HFEngine"
                )
            conv.add_model_turn(completion.token_ids, completion.logprobs, completion.policy_versions)
            metrics["turns"] += 1
            if on_turn is not None:
                on_turn()
            cut = completion.finish_reason == "length"
            # no observation can follow this turn: tell the env, so it does not run tools nobody will see
            last_turn = turn == cfg.max_turns - 1 or conv.remaining <= 0
            t0 = time.perf_counter()
            if last_turn and takes_last_turn:
                result = await env.step(completion.text, last_turn=True)
            else:
                result = await env.step(completion.text)
            metrics["env_latency_s"] += time.perf_counter() - t0
            for key, value in result.info.items():
                metrics[key] = metrics.get(key, 0.0) + float(value)
            if cut and (result.done or last_turn or budget < cfg.max_tokens_per_turn):
                finish = "length"  # the final turn was truncated: 'length' wins over done and max_turns
                break
            if result.done:
                finish = "stop"
                break
            if conv.remaining <= 0:
                finish = "length"
                break
            if last_turn:
                break
            if result.observation is None or result.observation.text is not None:
                # the observation continues the same assistant message (Search-R1): an EOS sampled here would sit
                # mid-message, teaching the model to stop mid-answer; Search-R1 never keeps it either
                conv.drop_trailing_model_token(self.template.eos_token_ids)
            if result.observation is None:  # nothing to show: the model simply continues its turn
                continue
            segments = self.template.observation_segments(result.observation, completion.token_ids)
            fits, truncated = conv.add_context(segments, cfg.max_obs_tokens, self._marker)
            metrics["obs_truncated"] += float(truncated)
            if not fits or conv.remaining <= 0:
                finish = "length"
                break
        metrics.update(
            model_tokens=float(conv.model_tokens),
            context_tokens=float(conv.context_tokens),
            response_tokens=float(len(conv.response_ids)),
            wall_s=time.perf_counter() - start,
        )
        traj = Trajectory(
            prompt_ids=conv.prompt_ids,
            response_ids=conv.response_ids,
            loss_mask=conv.loss_mask,
            rollout_logprobs=conv.logprobs if conv.has_logprobs else None,
            policy_versions=conv.versions if conv.has_versions else None,
            group_id=group_id,
            data_source=sample.data_source,
            ground_truth=sample.ground_truth,
            prompt_text=self.tokenizer.decode(conv.prompt_ids, skip_special_tokens=False),
            response_text=self.tokenizer.decode(conv.response_ids, skip_special_tokens=False),
            finish_reason=finish,
            extra_info=dict(sample.extra_info),
            metrics=metrics,
        )
        if cfg.compute_reward:
            await self._score(env, traj)
        return traj

    async def _score(self, env: Environment, traj: Trajectory) -> None:
        """Reward via the env's hook; a crashing reward scores 0 with the error in `traj.reward_error` (the one place
        every scoring error lives), never kills the batch."""
        try:
            out = await env.reward(traj)
        except Exception as exc:
            traj.reward = 0.0
            traj.reward_components = {}
            traj.reward_error = f"{type(exc).__name__}: {exc}"
            return
        traj.reward = float(out.score)
        traj.reward_components = dict(out.components)
        traj.reward_error = str(out.error) if out.error else None


def _describe(sample: Sample) -> str:
    """A short name for a sample in error messages: its question (or last prompt message), head and tail, since
    templated prompts (Search-R1's, veRL's) share a long head and differ in the question at the end; plus the
    row's data source and `extra_info.index` when it has them, which find it in the data file."""
    text = sample.question
    if text is None and sample.prompt:
        text = str(sample.prompt[-1].get("content", ""))
    text = " ".join((text or "").split())
    if len(text) > 80:
        text = text[:30] + " ... " + text[-45:]
    where = ""
    index = sample.extra_info.get("index")
    if index is not None:
        where = f" ({sample.data_source + ' ' if sample.data_source else ''}row index {index})"
    return f"question {text!r}{where}"


def rollout_metrics(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """Batch means of every per-trajectory metric plus finish-reason fractions, for the trainer's tracker."""
    if not trajectories:
        return {}
    out = {f"agent/{k}": v for k, v in metric_means([t.metrics for t in trajectories]).items()}
    for reason in sorted({*FINISH_REASONS, *(t.finish_reason for t in trajectories)}):
        out[f"agent/finish/{reason}"] = sum(t.finish_reason == reason for t in trajectories) / len(trajectories)
    rewards = [t.reward for t in trajectories if t.reward is not None]
    if rewards:
        out["agent/reward/mean"] = sum(rewards) / len(rewards)
    components = sorted({k for t in trajectories for k in t.reward_components})
    for key in components:
        vals = [t.reward_components[key] for t in trajectories if key in t.reward_components]
        out[f"agent/reward/{key}/mean"] = sum(vals) / len(vals)
    return out


def to_batch(trajectories: Sequence[Trajectory], tokenizer_or_pad_id: Any) -> TrajectoryBatch:
    """core-rl's padded `TrajectoryBatch` (prompts left-padded, responses right-padded), ready for the trainer."""
    pad = tokenizer_or_pad_id if isinstance(tokenizer_or_pad_id, int) else tokenizer_or_pad_id.pad_token_id
    if pad is None:
        raise ValueError("to_batch: the tokenizer has no pad_token_id; pass a pad id explicitly")
    return TrajectoryBatch.from_trajectories(trajectories, int(pad))
