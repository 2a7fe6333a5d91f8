"""One finished rollout, single- or multi-turn, as the trainer consumes it.

`response_ids` is everything after the prompt: model turns, tool observations and chat-template glue, in
order. `loss_mask[i]` is 1 only for tokens the policy sampled, so observations and template tokens carry no
loss; `rollout_logprobs[i]` is the engine's sampling logprob for sampled tokens and 0.0 elsewhere (the behaviour
policy's log-prob, which asynchronous training corrects against); `policy_versions[i]` is the policy version (the
training step of the weights) that sampled token i, and for other tokens the version of the last sampled token before
them (the prompt's version for tokens before any): a trajectory generated across weight updates spans versions.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class Trajectory:
    prompt_ids: list[int]
    response_ids: list[int]
    loss_mask: list[int]
    rollout_logprobs: list[float] | None = None
    policy_versions: list[int] | None = None
    group_id: str = ""  # samples of the same prompt share it (GRPO/RLOO groups)
    data_source: str = ""
    ground_truth: Any = None
    prompt_text: str = ""
    prompt_messages: list[dict[str, Any]] | None = None  # the chat prompt as given (a reward model re-renders it)
    response_text: str = ""
    finish_reason: str = "stop"
    multimodal: dict[str, Any] | None = None
    extra_info: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)  # turns, tool calls, tool latency, ...
    reward: float | None = None
    reward_components: dict[str, float] = field(default_factory=dict)
    reward_error: str | None = None  # why scoring failed (the reward is then 0); None when it scored cleanly

    def __post_init__(self) -> None:
        n = len(self.response_ids)
        if len(self.loss_mask) != n:
            raise ValueError(f"Trajectory: loss_mask has {len(self.loss_mask)} entries for {n} response tokens")
        if self.rollout_logprobs is not None and len(self.rollout_logprobs) != n:
            raise ValueError(
                f"Trajectory: rollout_logprobs has {len(self.rollout_logprobs)} entries for {n} response tokens"
            )
        if self.policy_versions is not None and len(self.policy_versions) != n:
            raise ValueError(
                f"Trajectory: policy_versions has {len(self.policy_versions)} entries for {n} response tokens"
            )
        if any(m not in (0, 1) for m in self.loss_mask):
            raise ValueError("Trajectory: loss_mask entries must be 0 or 1")

    @property
    def num_model_tokens(self) -> int:
        return sum(self.loss_mask)
