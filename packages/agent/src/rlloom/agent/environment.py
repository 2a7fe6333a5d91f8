"""The `Environment` protocol and the data it exchanges with `AgentLoop`.

An environment object lives for one conversation: `reset(sample)` gives the prompt, each `step(action)` reads
the model's turn and answers with an observation (or ends the episode), and `reward(trajectory)` scores the
finished conversation. Environments only ever see and produce *text*; the loop owns all token accounting, so
an environment cannot break the loss mask. Build one per conversation with a factory (`lambda: SearchEnv(...)`);
shared resources (retrievers, tool thread pools) are passed in and shared.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from rlloom.core_rl.contracts.protocols import RewardOutput
from rlloom.core_rl.contracts.trajectory import Trajectory
from rlloom.core_rl.data.loader import ground_truth, prompt_messages


class Sample(BaseModel):
    """One dataset row: a question or chat prompt plus what it is graded against."""

    model_config = ConfigDict(extra="forbid")

    question: str | None = Field(default=None, description="Plain question text (envs wrap it in their template).")
    prompt: list[dict[str, Any]] | None = Field(default=None, description="Chat messages, used as given.")
    ground_truth: Any = Field(default=None, description="What the reward compares against (e.g. gold answers).")
    data_source: str = Field(default="", description="Dataset name, kept for per-source metrics.")
    extra_info: dict[str, Any] = Field(default_factory=dict, description="Anything else the reward may need.")

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Sample:
        """Read a Search-R1/veRL row (`prompt`, `reward_model.ground_truth`, ...) or a flat QA row.

        Flat rows may use `question` and `answer`/`golden_answers`. Unknown keys go to `extra_info`.
        """
        known = {"question", "prompt", "ground_truth", "data_source", "extra_info", "reward_model"}
        known |= {"answer", "golden_answers"}
        try:  # the rows' reading is core-rl's, so a row trains the same through any collector
            prompt = prompt_messages(row)
        except ValueError as err:
            raise ValueError(f"Sample.from_row: {err}; give chat messages, a string, or a 'question'") from None
        extra = dict(row.get("extra_info") or {})
        extra.update({k: v for k, v in row.items() if k not in known})
        if row.get("question") is None and prompt is None:
            raise ValueError(f"Sample.from_row: row has neither 'question' nor 'prompt' (keys: {sorted(row)})")
        return cls(
            question=row.get("question"),
            prompt=prompt,
            ground_truth=ground_truth(row),
            data_source=str(row.get("data_source") or ""),
            extra_info=extra,
        )


@dataclass(slots=True)
class Prompt:
    """How a conversation starts: chat messages (rendered with the chat template) or raw text (base models)."""

    messages: list[dict[str, Any]] | None = None
    text: str | None = None
    tools: list[dict[str, Any]] | None = None  # JSON schemas handed to `apply_chat_template(tools=...)`

    def __post_init__(self) -> None:
        if (self.messages is None) == (self.text is None):
            raise ValueError("Prompt needs exactly one of `messages` or `text`")


@dataclass(slots=True)
class Observation:
    """What the environment shows the model next; it never carries loss.

    Either `messages` (new chat turns such as tool results, rendered with the chat template and its turn
    boundaries), or `text` appended inside the current assistant turn (Search-R1's `<information>` blocks).
    `before`/`after` wrap `text` and are never truncated, so a closing tag survives `max_obs_tokens`.
    `truncate` says where `max_obs_tokens` removes tokens: "end" keeps the head (Search-R1), "middle" keeps
    head and tail (program output, whose last lines carry the error).
    """

    text: str | None = None
    messages: list[dict[str, Any]] | None = None
    before: str = ""
    after: str = ""
    truncate: Literal["end", "middle"] = "end"

    def __post_init__(self) -> None:
        if (self.messages is None) == (self.text is None):
            raise ValueError("Observation needs exactly one of `text` or `messages`")
        if self.messages is not None and not self.messages:
            raise ValueError("Observation.messages is empty; give at least one message or use `text`")


class StepResult(NamedTuple):
    """The answer to one model turn. `info` values are numbers summed into the trajectory's metrics."""

    observation: Observation | None
    done: bool
    info: dict[str, float] = {}  # noqa: RUF012  (NamedTuple default, never mutated)


@runtime_checkable
class Environment(Protocol):
    """One conversation's world: prompt, reaction to each model turn, and the final reward."""

    @property
    def stop(self) -> list[str]:
        """Stop strings for the model's turns (e.g. `</search>`), kept in the sampled tokens."""
        ...

    def reset(self, sample: Sample) -> Prompt:
        """Start the conversation for `sample`."""
        ...

    async def step(self, action: str, *, last_turn: bool = False) -> StepResult:
        """React to the text of the model's latest turn.

        `last_turn=True`: the loop ends the episode after this turn whatever the answer (max_turns spent, or no
        token left), so no observation will be shown; record the action for the reward but run no tools.
        The loop passes it only to envs whose `step` accepts it.
        """
        ...

    async def reward(self, trajectory: Trajectory) -> RewardOutput:
        """Score the finished conversation (components are logged separately)."""
        ...


def step_takes_last_turn(env: Environment) -> bool:
    """Whether `env.step` takes the `last_turn` keyword (envs written before it existed still work)."""
    try:
        params = inspect.signature(env.step).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == "last_turn" or p.kind is inspect.Parameter.VAR_KEYWORD for p in params)
