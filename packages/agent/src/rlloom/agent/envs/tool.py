"""`ToolEnv`: the model calls plain Python functions in its native tool-call format until it answers.

A turn with tool calls gets one `tool` message per call, in call order (result, or the error text for a call
that failed or could not be parsed), rendered by the chat template as the model was trained to read them; a turn
without a tool call is the final answer and ends the episode. Calls within a turn run concurrently; across
conversations they overlap with generation. On the turn the loop ends the episode after (`last_turn`), calls
are not run (nobody would see their results); they are counted as `tool_calls_skipped`.
The tool-call format is the parser's: a `ToolCallParser`, or a name from `TOOL_CALL_PARSERS` (`"hermes"`, the
default; `"llama3_json"`, `"mistral"`, `"qwen3_coder"`), built for this environment's tools.
"""

from __future__ import annotations

import asyncio
from typing import Literal

from rlloom.agent.environment import Observation, Prompt, Sample, StepResult
from rlloom.agent.envs.single_turn import chat_messages
from rlloom.agent.rewards import AgentRubric, EpisodeSummary
from rlloom.agent.tool_calls import HermesToolCallParser, ToolCall, ToolCallParser, make_tool_call_parser
from rlloom.agent.tools import ToolResult, Toolset
from rlloom.core_rl.contracts.protocols import RewardOutput
from rlloom.core_rl.contracts.trajectory import Trajectory

TOOL_METRICS = ("tool_calls", "tool_errors", "tool_latency_s", "tool_calls_skipped")
"""Counters every `ToolEnv.step` reports (zeros included), so `rollout/tool_calls/mean` is logged as 0 on a step
where no conversation called a tool instead of missing from metrics.jsonl."""


def _counts(**values: float) -> dict[str, float]:
    return {**dict.fromkeys(TOOL_METRICS, 0.0), **values}


class ToolEnv:
    """One tool-using conversation over a shared `Toolset`.

    `parser`: a `ToolCallParser`, or the name of one in `TOOL_CALL_PARSERS` (vLLM's `--tool-call-parser` names),
    made with the toolset's schemas; an unknown name raises, listing the valid ones. Default: Hermes/Qwen.
    """

    def __init__(
        self,
        toolset: Toolset,
        rubric: AgentRubric,
        *,
        parser: ToolCallParser | str | None = None,
        system_prompt: str | None = None,
        template: str = "{question}",
        max_calls_per_turn: int = 8,
        tool_role: str = "tool",
        truncate: Literal["end", "middle"] = "end",
    ) -> None:
        if max_calls_per_turn < 1:
            raise ValueError(f"ToolEnv: max_calls_per_turn must be >= 1, got {max_calls_per_turn}")
        self.toolset = toolset
        self.rubric = rubric
        if isinstance(parser, str):
            self.parser: ToolCallParser = make_tool_call_parser(parser, toolset.schemas)
        else:
            self.parser = parser or HermesToolCallParser()
        self.system_prompt = system_prompt
        self.template = template
        self.max_calls_per_turn = max_calls_per_turn
        self.tool_role = tool_role
        self.truncate: Literal["end", "middle"] = truncate
        self._sample: Sample | None = None
        self._actions: list[str] = []
        self._well_formed = 0
        self._calls = 0
        self._errors = 0

    @property
    def stop(self) -> list[str]:
        return []  # a turn ends at the model's end-of-turn token

    def reset(self, sample: Sample) -> Prompt:
        self._sample = sample
        messages = chat_messages(sample, system_prompt=self.system_prompt, template=self.template)
        return Prompt(messages=messages, tools=self.toolset.schemas)

    async def step(self, action: str, *, last_turn: bool = False) -> StepResult:
        self._actions.append(action)
        parsed = self.parser.parse(action)
        if not parsed.found_any:
            self._well_formed += 1
            return StepResult(None, True, _counts())
        if not parsed.errors:
            self._well_formed += 1
        if last_turn:
            return StepResult(None, False, _counts(tool_calls_skipped=float(len(parsed.blocks))))
        blocks = parsed.blocks[: self.max_calls_per_turn]
        results = await asyncio.gather(*(self._run(b) for b in blocks))
        contents = [r.content for r in results]
        if len(parsed.blocks) > self.max_calls_per_turn:
            contents.append(
                f"Error: {len(parsed.blocks)} tool calls in one turn; only the first {self.max_calls_per_turn} ran"
            )
        n_errors = sum(not r.ok for r in results)
        self._calls += len(results)
        self._errors += n_errors
        info = _counts(
            tool_calls=float(len(results)),
            tool_errors=float(n_errors),
            tool_latency_s=sum(r.latency_s for r in results),
        )
        messages = [{"role": self.tool_role, "content": c} for c in contents]
        return StepResult(Observation(messages=messages, truncate=self.truncate), False, info)

    async def _run(self, block: ToolCall | str) -> ToolResult:
        """Run a parsed call; a malformed one answers with its parse error."""
        if isinstance(block, str):
            return ToolResult("", f"Error: {block}", False)
        return await self.toolset.call(block)

    async def reward(self, trajectory: Trajectory) -> RewardOutput:
        if self._sample is None:
            raise RuntimeError("ToolEnv.reward called before reset()")
        episode = EpisodeSummary(
            model_text=self._actions[-1] if self._actions else "",
            ground_truth=self._sample.ground_truth,
            extra_info=self._sample.extra_info,
            turns_well_formed=self._well_formed,
            turns=len(self._actions),
            tool_calls=self._calls,
            tool_errors=self._errors,
        )
        return await self.rubric.ascore(episode)
