"""The prompt stream: a stateful loader whose position is part of every checkpoint.

Rows follow the veRL/Search-R1 shape: `prompt` (chat messages, or a plain string taken as one user message),
`data_source`, `reward_model.ground_truth`, `extra_info`; `prompt_ids` may replace `prompt`. Each epoch's order
is a permutation seeded by (seed, epoch) of the rows still in play, so the state to save is two integers and the
set of excluded rows (retired by online prompt filtering, `prompt_filter.py`), and a resumed run sees the same
prompts in the same order, including across an epoch boundary.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch

from rlloom.core_rl.generation import GenerationRequest, SamplingParams

Row = Mapping[str, Any]


class PromptLoader:
    """Yields batches of `batch_size` rows forever, epoch after epoch."""

    def __init__(
        self, rows: Sequence[Row], batch_size: int, *, shuffle: bool = True, seed: int = 0, drop_last: bool = False
    ) -> None:
        if not rows:
            raise ValueError("PromptLoader: the training data has no rows")
        if drop_last and batch_size > len(rows):
            raise ValueError(
                f"PromptLoader: data.train_batch_size={batch_size} exceeds the {len(rows)} rows and drop_last "
                "is set, so no batch could be formed; lower the batch size or set data.drop_last=false"
            )
        self.rows = rows
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.epoch = 0
        self.position = 0  # rows of the current epoch already served
        self.excluded: frozenset[int] = frozenset()  # row indices left out of every epoch from now on

    @property
    def active_ids(self) -> list[int]:
        """Indices of the rows still served, in data order."""
        return [i for i in range(len(self.rows)) if i not in self.excluded]

    @property
    def batches_per_epoch(self) -> int:
        full, rest = divmod(len(self.active_ids), self.batch_size)
        return full + (1 if rest and not self.drop_last else 0)

    @property
    def epoch_finished(self) -> bool:
        """True when the next batch starts a new epoch (the moment to change `excluded`)."""
        remaining = len(self.active_ids) - self.position
        return remaining <= 0 or (self.drop_last and remaining < self.batch_size)

    def _order(self, epoch: int) -> list[int]:
        active = self.active_ids
        if not self.shuffle:
            return active
        gen = torch.Generator().manual_seed(self.seed * 100_003 + epoch)
        return [active[i] for i in torch.randperm(len(active), generator=gen).tolist()]

    def next_batch(self) -> list[Row]:
        """The next batch; the last batch of an epoch may be smaller (unless drop_last), then a new epoch starts."""
        return [self.rows[i] for i in self.next_batch_ids()]

    def next_batch_ids(self) -> list[int]:
        """Like `next_batch`, as row indices into the training data."""
        if self.epoch_finished:
            self.epoch += 1
            self.position = 0
        order = self._order(self.epoch)
        picked = order[self.position : self.position + self.batch_size]
        self.position += len(picked)
        return picked

    def exclude(self, ids: Iterable[int]) -> None:
        """Leave rows out of every later epoch; only between epochs, since the order of an epoch depends on it."""
        if self.position != 0 and not self.epoch_finished:
            raise RuntimeError(
                f"PromptLoader.exclude: epoch {self.epoch} is in progress ({self.position} rows served); exclude "
                "rows only when `epoch_finished` is true, so the epoch's order does not change under it"
            )
        ids = frozenset(ids)
        unknown = sorted(i for i in ids if not 0 <= i < len(self.rows))
        if unknown:
            raise IndexError(f"PromptLoader.exclude: row indices {unknown[:5]} are outside 0..{len(self.rows) - 1}")
        self.excluded = self.excluded | ids

    def state_dict(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "position": self.position,
            "num_rows": len(self.rows),
            "excluded": sorted(self.excluded),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if state.get("num_rows", len(self.rows)) != len(self.rows):
            raise ValueError(
                f"PromptLoader: the checkpoint was taken over {state['num_rows']} rows but the data now has "
                f"{len(self.rows)}; resume with the same training data or start a new run (trainer.resume=never)"
            )
        self.epoch = int(state["epoch"])
        self.position = int(state["position"])
        self.excluded = frozenset(int(i) for i in state.get("excluded", ()))


def generation_request(row: Row, sampling: SamplingParams) -> GenerationRequest:
    """The engine request for one data row (chat messages, a plain string, or token ids)."""
    if "prompt_ids" in row:
        return GenerationRequest(prompt_ids=list(row["prompt_ids"]), sampling=sampling)
    prompt = row.get("prompt")
    if isinstance(prompt, str):
        return GenerationRequest(messages=[{"role": "user", "content": prompt}], sampling=sampling)
    if isinstance(prompt, Sequence) and prompt:
        return GenerationRequest(messages=[dict(m) for m in prompt], sampling=sampling)
    raise ValueError(f"data row has no usable 'prompt' (chat messages or a string) nor 'prompt_ids': {dict(row)!r}")


def ground_truth(row: Row) -> Any:
    """`reward_model.ground_truth` (veRL shape) or a top-level `ground_truth`."""
    reward_model = row.get("reward_model")
    if isinstance(reward_model, Mapping) and "ground_truth" in reward_model:
        return reward_model["ground_truth"]
    return row.get("ground_truth")
