"""Token accounting for one conversation: the single place that decides what carries loss.

Model turns are appended as the engine sampled them (ids and logprobs, loss_mask 1); everything else
(observations, template glue, truncation markers) is appended with loss_mask 0 and logprob 0.0. Length limits
are enforced here too, so no path can build a response longer than `max_total_tokens`.
"""

from __future__ import annotations

from collections.abc import Sequence

from rlloom.agent.turns import Segment


class ConversationTokens:
    """The growing response of one conversation, with its loss mask and rollout logprobs."""

    def __init__(self, prompt_ids: Sequence[int], max_total_tokens: int) -> None:
        if len(prompt_ids) >= max_total_tokens:
            raise ValueError(
                f"prompt has {len(prompt_ids)} tokens but a conversation may hold {max_total_tokens} in all "
                "(AgentLoopConfig.max_total_tokens, capped by the engine's context window); shorten the prompt, "
                "or raise the limit if the model takes more"
            )
        self.prompt_ids = list(prompt_ids)
        self.max_total_tokens = max_total_tokens
        self.response_ids: list[int] = []
        self.loss_mask: list[int] = []
        self.logprobs: list[float] = []
        self.has_logprobs = True
        self.model_tokens = 0
        self.context_tokens = 0

    @property
    def context(self) -> list[int]:
        """Everything the model conditions on for its next turn."""
        return self.prompt_ids + self.response_ids

    @property
    def remaining(self) -> int:
        """Tokens that may still be added before the total limit."""
        return self.max_total_tokens - len(self.prompt_ids) - len(self.response_ids)

    def add_model_turn(self, token_ids: Sequence[int], logprobs: Sequence[float] | None) -> None:
        """Append sampled tokens as-is (loss_mask 1). They must fit: the request's max_tokens ensures it."""
        if len(token_ids) > self.remaining:
            raise ValueError(
                f"the engine returned {len(token_ids)} tokens but only {self.remaining} fit; "
                "it ignored SamplingParams.max_tokens"
            )
        if logprobs is None:
            self.has_logprobs = False
            logprobs = [0.0] * len(token_ids)
        elif len(logprobs) != len(token_ids):
            raise ValueError(f"engine returned {len(logprobs)} logprobs for {len(token_ids)} tokens")
        self.response_ids.extend(token_ids)
        self.loss_mask.extend([1] * len(token_ids))
        self.logprobs.extend(float(x) for x in logprobs)
        self.model_tokens += len(token_ids)

    def add_context(
        self, segments: Sequence[Segment], max_obs_tokens: int | None, marker: Sequence[int]
    ) -> tuple[bool, bool]:
        """Append an observation (loss_mask 0); returns (fits the total limit, was truncated by max_obs_tokens).

        Truncatable segments longer than `max_obs_tokens` keep their first tokens plus `marker`.
        """
        ids: list[int] = []
        truncated = False
        for seg in segments:
            part = seg.ids
            if seg.truncatable and max_obs_tokens is not None and len(part) > max_obs_tokens:
                keep = max(0, max_obs_tokens - len(marker))
                part = part[:keep] + list(marker)
                truncated = True
            ids.extend(part)
        fits = len(ids) <= self.remaining
        if not fits:
            ids = ids[: max(0, self.remaining)]
        self.response_ids.extend(ids)
        self.loss_mask.extend([0] * len(ids))
        self.logprobs.extend([0.0] * len(ids))
        self.context_tokens += len(ids)
        return fits, truncated
