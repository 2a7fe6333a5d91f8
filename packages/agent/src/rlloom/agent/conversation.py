"""Token accounting for one conversation: the single place that decides what carries loss.

Model turns are appended as the engine sampled them (ids and logprobs, loss_mask 1); everything else
(observations, template glue, truncation markers) is appended with loss_mask 0 and logprob 0.0. The one edit
of sampled tokens is dropping an EOS that ended a turn the same message continues after (see `AgentLoop`).
Policy versions follow the same split: a sampled token carries the version the engine labelled it with, every
other token the version of the last sampled token before it (a conversation may span weight updates).
Length limits are enforced here too, so no path can build a response longer than `max_total_tokens`.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from rlloom.agent.turns import Segment


class ConversationTokens:
    """The growing response of one conversation, with its loss mask, rollout logprobs and policy versions."""

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
        self.versions: list[int] = []
        self.has_versions = True  # False once a turn came without versions (the engine does not track them)
        self._last_version = 0
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

    def add_model_turn(
        self, token_ids: Sequence[int], logprobs: Sequence[float] | None, versions: Sequence[int] | None = None
    ) -> None:
        """Append sampled tokens as-is (loss_mask 1), with the policy version of each (None: not tracked).
        They must fit: the request's max_tokens ensures it."""
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
        if versions is None:
            self.has_versions = False
            versions = [self._last_version] * len(token_ids)
        elif len(versions) != len(token_ids):
            raise ValueError(f"engine returned {len(versions)} policy_versions for {len(token_ids)} tokens")
        if versions:
            self._last_version = int(versions[-1])
        self.versions.extend(int(v) for v in versions)
        self.response_ids.extend(token_ids)
        self.loss_mask.extend([1] * len(token_ids))
        self.logprobs.extend(float(x) for x in logprobs)
        self.model_tokens += len(token_ids)

    def drop_trailing_model_token(self, token_ids: Collection[int]) -> bool:
        """Remove the last token (id, mask and logprob) if the model sampled it and it is in `token_ids`."""
        if not self.loss_mask or self.loss_mask[-1] != 1 or self.response_ids[-1] not in token_ids:
            return False
        self.response_ids.pop()
        self.loss_mask.pop()
        self.logprobs.pop()
        self.versions.pop()  # the tokens after it still take its version: it was the last one sampled
        self.model_tokens -= 1
        return True

    def add_context(
        self, segments: Sequence[Segment], max_obs_tokens: int | None, marker: Sequence[int]
    ) -> tuple[bool, bool]:
        """Append an observation (loss_mask 0); returns (fits the total limit, was truncated by max_obs_tokens).

        The truncatable segments (message contents) hold `max_obs_tokens` in all: each gets a fair share (short
        ones keep everything, the rest split what is left), and one over its share keeps its head (or head and
        tail, `Segment.cut == "middle"`) around `marker`.
        """
        contents = [i for i, seg in enumerate(segments) if seg.truncatable]
        shares = fair_shares([len(segments[i].ids) for i in contents], max_obs_tokens)
        allowed = dict(zip(contents, shares, strict=True))
        ids: list[int] = []
        truncated = False
        for i, seg in enumerate(segments):
            part = seg.ids
            if i in allowed and len(part) > allowed[i]:
                part = _cut(part, allowed[i], list(marker), seg.cut)
                truncated = True
            ids.extend(part)
        fits = len(ids) <= self.remaining
        if not fits:
            ids = ids[: max(0, self.remaining)]
        self.response_ids.extend(ids)
        self.loss_mask.extend([0] * len(ids))
        self.logprobs.extend([0.0] * len(ids))
        self.versions.extend([self._last_version] * len(ids))
        self.context_tokens += len(ids)
        return fits, truncated


def fair_shares(lengths: Sequence[int], cap: int | None) -> list[int]:
    """Split `cap` tokens over pieces of `lengths`: pieces under an equal share keep all, the rest split the
    remainder equally (earlier pieces get the odd tokens). No cap: everything is kept."""
    if cap is None or sum(lengths) <= cap:
        return list(lengths)
    shares = list(lengths)
    left = cap
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    for pos, i in enumerate(order):
        rest = order[pos:]
        share = left // len(rest)
        if lengths[i] > share:
            extra = left - share * len(rest)
            for rank, j in enumerate(sorted(rest)):
                shares[j] = share + (rank < extra)
            break
        left -= lengths[i]
    return shares


def _cut(ids: list[int], keep: int, marker: list[int], where: str) -> list[int]:
    """`ids` shortened to `keep` tokens, marker included (a share smaller than the marker keeps its start)."""
    room = keep - len(marker)
    if room <= 0:
        return marker[:keep]
    if where == "middle":
        head = room // 2
        return ids[:head] + marker + ids[len(ids) - (room - head) :]
    return ids[:room] + marker
