"""The batch the trainer passes between phases: padded token tensors plus per-sample data.

Layout (veRL's, so its users feel at home): `input_ids[B, P+R]` is a left-padded prompt of width P followed by
a right-padded response of width R; real tokens are contiguous in each row. Three keys span the whole row
(`input_ids`, `attention_mask`, `position_ids`); every other 2-D tensor is response-aligned `[B, R]`
(`loss_mask`, `rollout_logprobs`, then `old_logprobs`, `ref_logprobs`, `values`, `token_rewards`,
`advantages`, `returns` as the step fills them in) and 1-D tensors are per sample (`scores`, lengths).
Non-tensor data (group ids, data sources, ground truths, text, multimodal inputs) rides along in lists.

A small dataclass rather than tensordict: the batch needs prompt/response-aware padding on concat and
token-budget micro-batching, which tensordict does not know about, and one dependency less keeps the
embedded install light. Nothing here assumes one process owns all data: `select`/`split` return new batches
that a distributed worker group can scatter, and `concat` re-pads batches of different widths.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from rlloom.core_rl.contracts.packing import token_budget_bins
from rlloom.core_rl.contracts.trajectory import Trajectory

ROW_KEYS = ("input_ids", "attention_mask", "position_ids")
"""Keys that span prompt + response; all other 2-D tensors are response-aligned."""

NON_TENSOR_FIELDS = (
    "group_id",
    "data_source",
    "ground_truth",
    "prompt_text",
    "response_text",
    "finish_reason",
    "multimodal",
    "extra_info",
    "traj_metrics",
    "reward_components",
)


@dataclass
class TrajectoryBatch:
    """Named tensors with a shared batch dimension, plus per-sample lists of anything else."""

    tensors: dict[str, torch.Tensor]
    non_tensors: dict[str, list[Any]] = field(default_factory=dict)
    pad_token_id: int = 0

    def __post_init__(self) -> None:
        for key in ROW_KEYS:
            if key not in self.tensors:
                raise ValueError(f"TrajectoryBatch: missing tensor {key!r}; build batches with from_trajectories()")
        for key, value in list(self.tensors.items()):
            self._check(key, value)
        for key, values in self.non_tensors.items():
            if len(values) != self.batch_size:
                raise ValueError(
                    f"TrajectoryBatch: non-tensor {key!r} has {len(values)} entries for batch size {self.batch_size}"
                )

    # ----------------------------------------------------------------- construction
    @classmethod
    def from_trajectories(
        cls,
        trajectories: Sequence[Trajectory],
        pad_token_id: int,
        *,
        device: torch.device | str | None = None,
    ) -> TrajectoryBatch:
        """Pad trajectories into a batch: prompts left-padded, responses right-padded.

        `rollout_logprobs` (and `policy_versions`) becomes a tensor when every trajectory has them, `scores` when
        every trajectory has a reward; a mix of present and absent is an error, because a silent zero would bias
        the loss.
        """
        if not trajectories:
            raise ValueError("TrajectoryBatch.from_trajectories: got no trajectories")
        bsz = len(trajectories)
        width_p = max(len(t.prompt_ids) for t in trajectories)
        width_r = max(1, *(len(t.response_ids) for t in trajectories))
        if width_p == 0:
            raise ValueError("TrajectoryBatch.from_trajectories: every prompt is empty; prompts need >= 1 token")
        input_ids = torch.full((bsz, width_p + width_r), pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((bsz, width_p + width_r), dtype=torch.long)
        loss_mask = torch.zeros((bsz, width_r), dtype=torch.long)
        has_lp = [t.rollout_logprobs is not None for t in trajectories]
        if any(has_lp) and not all(has_lp):
            raise ValueError(
                "TrajectoryBatch.from_trajectories: some trajectories have rollout_logprobs and some do not; "
                "ask the engine for logprobs on every request (SamplingParams.logprobs=True)"
            )
        rollout_lp = torch.zeros((bsz, width_r), dtype=torch.float32) if all(has_lp) else None
        # per-token policy versions (asynchronous RL's staleness) only when every trajectory carries them
        versioned = all(t.policy_versions is not None for t in trajectories)
        versions = torch.zeros((bsz, width_r), dtype=torch.long) if versioned else None
        for i, t in enumerate(trajectories):
            n_p, n_r = len(t.prompt_ids), len(t.response_ids)
            if n_p == 0:
                raise ValueError(f"TrajectoryBatch.from_trajectories: trajectory {i} has an empty prompt")
            input_ids[i, width_p - n_p : width_p] = torch.tensor(t.prompt_ids, dtype=torch.long)
            attention_mask[i, width_p - n_p : width_p + n_r] = 1
            if n_r:
                input_ids[i, width_p : width_p + n_r] = torch.tensor(t.response_ids, dtype=torch.long)
                loss_mask[i, :n_r] = torch.tensor(t.loss_mask, dtype=torch.long)
                if rollout_lp is not None and t.rollout_logprobs is not None:
                    rollout_lp[i, :n_r] = torch.tensor(t.rollout_logprobs, dtype=torch.float32)
                if versions is not None and t.policy_versions is not None:
                    versions[i, :n_r] = torch.tensor(t.policy_versions, dtype=torch.long)
        tensors: dict[str, torch.Tensor] = {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "position_ids": position_ids_from_mask(attention_mask),
            "loss_mask": loss_mask,
            "prompt_lengths": torch.tensor([len(t.prompt_ids) for t in trajectories], dtype=torch.long),
            "response_lengths": torch.tensor([len(t.response_ids) for t in trajectories], dtype=torch.long),
        }
        if rollout_lp is not None:
            tensors["rollout_logprobs"] = rollout_lp
        if versions is not None:
            tensors["policy_versions"] = versions
        rewards = [t.reward for t in trajectories]
        if all(r is not None for r in rewards):
            tensors["scores"] = torch.tensor(rewards, dtype=torch.float32)
        non_tensors: dict[str, list[Any]] = {
            "group_id": [t.group_id for t in trajectories],
            "data_source": [t.data_source for t in trajectories],
            "ground_truth": [t.ground_truth for t in trajectories],
            "prompt_text": [t.prompt_text for t in trajectories],
            "response_text": [t.response_text for t in trajectories],
            "finish_reason": [t.finish_reason for t in trajectories],
            "multimodal": [t.multimodal for t in trajectories],
            "extra_info": [t.extra_info for t in trajectories],
            "traj_metrics": [t.metrics for t in trajectories],
            "reward_components": [t.reward_components for t in trajectories],
        }
        batch = cls(tensors=tensors, non_tensors=non_tensors, pad_token_id=pad_token_id)
        return batch.to(device) if device is not None else batch

    # ----------------------------------------------------------------- shape
    @property
    def batch_size(self) -> int:
        return int(self.tensors["input_ids"].shape[0])

    @property
    def response_width(self) -> int:
        """R: columns of the response part (longest response in the batch, at least 1)."""
        return int(self.tensors["loss_mask"].shape[1]) if "loss_mask" in self.tensors else 0

    @property
    def prompt_width(self) -> int:
        return int(self.tensors["input_ids"].shape[1]) - self.response_width

    @property
    def responses(self) -> torch.Tensor:
        return self.tensors["input_ids"][:, self.prompt_width :]

    @property
    def response_attention_mask(self) -> torch.Tensor:
        """1 for every real response token, observations included (values and rewards live on these)."""
        return self.tensors["attention_mask"][:, self.prompt_width :]

    @property
    def loss_mask(self) -> torch.Tensor:
        """1 only for tokens the policy sampled."""
        return self.tensors["loss_mask"]

    @property
    def seq_lengths(self) -> torch.Tensor:
        """Real tokens per row (prompt + response)."""
        return self.tensors["attention_mask"].sum(-1)

    def __len__(self) -> int:
        return self.batch_size

    def __contains__(self, key: str) -> bool:
        return key in self.tensors or key in self.non_tensors

    def __getitem__(self, key: str) -> torch.Tensor:
        try:
            return self.tensors[key]
        except KeyError:
            raise KeyError(f"TrajectoryBatch has no tensor {key!r}; it has {sorted(self.tensors)}") from None

    def __setitem__(self, key: str, value: torch.Tensor) -> None:
        self._check(key, value)
        self.tensors[key] = value

    def _check(self, key: str, value: torch.Tensor) -> None:
        bsz = int(self.tensors["input_ids"].shape[0])
        if value.ndim == 0 or value.shape[0] != bsz:
            raise ValueError(f"TrajectoryBatch[{key!r}]: shape {tuple(value.shape)} lacks batch dimension {bsz}")
        if value.ndim >= 2 and key not in ROW_KEYS and "loss_mask" in self.tensors:
            width_r = int(self.tensors["loss_mask"].shape[1])
            if value.shape[1] != width_r:
                raise ValueError(
                    f"TrajectoryBatch[{key!r}]: response-aligned tensors need {width_r} columns, got {value.shape[1]}"
                )
        if value.ndim >= 2 and key in ROW_KEYS and value.shape[1] != self.tensors["input_ids"].shape[1]:
            raise ValueError(f"TrajectoryBatch[{key!r}]: needs {self.tensors['input_ids'].shape[1]} columns")

    # ----------------------------------------------------------------- operations
    def select(self, indices: Sequence[int] | torch.Tensor) -> TrajectoryBatch:
        """Rows `indices`, in that order (a new batch; tensors are gathered copies)."""
        idx = torch.as_tensor(indices, dtype=torch.long)
        cpu_idx = idx.tolist()
        return TrajectoryBatch(
            tensors={k: v[idx.to(v.device)] for k, v in self.tensors.items()},
            non_tensors={k: [v[i] for i in cpu_idx] for k, v in self.non_tensors.items()},
            pad_token_id=self.pad_token_id,
        )

    def split(self, size: int) -> list[TrajectoryBatch]:
        """Consecutive chunks of `size` rows; the last one holds the remainder (never an error)."""
        if size < 1:
            raise ValueError(f"TrajectoryBatch.split: size must be >= 1, got {size}")
        return [self.select(range(s, min(s + size, self.batch_size))) for s in range(0, self.batch_size, size)]

    def micro_batches(self, max_tokens: int, *, padded: bool = True) -> list[tuple[list[int], TrajectoryBatch]]:
        """Bin-pack rows into micro-batches of at most `max_tokens` tokens (dynamic batch size).

        With `padded=True` a micro-batch costs rows x its padded width (what a padded forward computes); with
        `padded=False` it costs its real tokens (packed varlen forward). A row longer than the budget gets a
        micro-batch of its own. Each micro-batch is trimmed to its own widths; returns (row indices, batch).
        """
        plens = self.tensors["prompt_lengths"].tolist() if "prompt_lengths" in self.tensors else None
        bins = token_budget_bins(self.seq_lengths.tolist(), max_tokens, padded=padded, prompt_lengths=plens)
        return [(rows, self.select(rows).trimmed()) for rows in bins]

    def trimmed(self) -> TrajectoryBatch:
        """Drop columns that are padding in every row (left of the prompts, right of the responses)."""
        width_p, width_r = self.prompt_width, self.response_width
        plen = self.tensors.get("prompt_lengths", None)
        rmask = self.response_attention_mask
        keep_p = int(plen.max()) if plen is not None else width_p
        used_r = rmask.any(0).nonzero()
        keep_r = max(1, int(used_r.max()) + 1) if used_r.numel() else 1
        if keep_p == width_p and keep_r == width_r:
            return self
        tensors: dict[str, torch.Tensor] = {}
        for key, value in self.tensors.items():
            if key in ROW_KEYS:
                tensors[key] = value[:, width_p - keep_p : width_p + keep_r]
            elif value.ndim >= 2:
                tensors[key] = value[:, :keep_r]
            else:
                tensors[key] = value
        return TrajectoryBatch(tensors=tensors, non_tensors=dict(self.non_tensors), pad_token_id=self.pad_token_id)

    @staticmethod
    def concat(batches: Sequence[TrajectoryBatch]) -> TrajectoryBatch:
        """Stack batches row-wise, re-padding prompts (left) and responses (right) to the widest."""
        if not batches:
            raise ValueError("TrajectoryBatch.concat: got no batches")
        keys = set(batches[0].tensors)
        nt_keys = set(batches[0].non_tensors)
        for i, b in enumerate(batches[1:], start=1):
            if set(b.tensors) != keys or set(b.non_tensors) != nt_keys:
                diff = sorted((set(b.tensors) | set(b.non_tensors)) ^ (keys | nt_keys))
                raise ValueError(f"TrajectoryBatch.concat: batch {i} differs from batch 0 in keys {diff}")
        width_p = max(b.prompt_width for b in batches)
        width_r = max(b.response_width for b in batches)
        pad_id = batches[0].pad_token_id
        tensors: dict[str, torch.Tensor] = {}
        for key in batches[0].tensors:
            parts = []
            for b in batches:
                value = b.tensors[key]
                if key in ROW_KEYS:
                    fill = pad_id if key == "input_ids" else 0
                    prompt = _pad_cols(value[:, : b.prompt_width], width_p, fill, left=True)
                    response = _pad_cols(value[:, b.prompt_width :], width_r, fill, left=False)
                    value = torch.cat([prompt, response], dim=1)
                elif value.ndim >= 2:
                    value = _pad_cols(value, width_r, 0, left=False)
                parts.append(value)
            tensors[key] = torch.cat(parts, dim=0)
        non_tensors = {k: [x for b in batches for x in b.non_tensors[k]] for k in batches[0].non_tensors}
        return TrajectoryBatch(tensors=tensors, non_tensors=non_tensors, pad_token_id=pad_id)

    def to(self, device: torch.device | str) -> TrajectoryBatch:
        return TrajectoryBatch(
            tensors={k: v.to(device) for k, v in self.tensors.items()},
            non_tensors=self.non_tensors,
            pad_token_id=self.pad_token_id,
        )

    def update(self, tensors: Mapping[str, torch.Tensor]) -> None:
        """Add or replace several tensors at once (each checked like `batch[key] = value`)."""
        for key, value in tensors.items():
            self[key] = value


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """0, 1, 2 ... from each row's first real token; padding gets 0 (it is masked out anyway)."""
    return (attention_mask.cumsum(-1) - 1).clamp(min=0) * attention_mask


def scatter_rows(parts: Sequence[tuple[Sequence[int], torch.Tensor]], batch_size: int, width: int) -> torch.Tensor:
    """Assemble per-micro-batch `[b_i, w_i]` results back into one `[batch_size, width]` tensor (zero-filled)."""
    first = parts[0][1]
    out = first.new_zeros((batch_size, width, *first.shape[2:]))
    for rows, value in parts:
        out[torch.as_tensor(list(rows), dtype=torch.long, device=out.device), : value.shape[1]] = value
    return out


def _pad_cols(value: torch.Tensor, width: int, fill: float, *, left: bool) -> torch.Tensor:
    missing = width - value.shape[1]
    if missing == 0:
        return value
    pad = value.new_full((value.shape[0], missing, *value.shape[2:]), fill)
    return torch.cat([pad, value] if left else [value, pad], dim=1)
