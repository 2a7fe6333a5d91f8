"""One rank's share of a data-parallel FSDP2 actor, reference and critic.

Every rank receives the whole batch and takes the rows `balance_rows` gives it. FSDP2 gathers each layer's
weights in a collective, so all ranks must run the same number of forwards (and backwards): a rank with fewer
micro-batches (or no rows at all) runs extra ones on a borrowed row with loss weight 0. Losses are divided by
the whole mini-batch's counts, gradients are summed across ranks and metric totals summed with one all-reduce,
so a step on N ranks equals the single-process step up to float summation order.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import FSDPModule

from rlloom.core_rl.contracts.batch import TrajectoryBatch
from rlloom.core_rl.distributed.fsdp import (
    full_model_state,
    full_optimizer_state,
    full_tensor_sizes,
    gather_full_tensors,
    load_full_optimizer_state,
    lora_scalings,
    lora_sources,
    merge_lora_state,
)
from rlloom.core_rl.distributed.partition import balance_rows
from rlloom.core_rl.workers.actor import (
    ADAPTER_DIR,
    MAX_METRIC_SUFFIX,
    PolicyActor,
    ReferencePolicy,
    micro_batch_logprobs,
)
from rlloom.core_rl.workers.critic import ValueCritic
from rlloom.core_rl.workers.forward import rope_rows
from rlloom.core_rl.workers.optim import configured_hyperparameters
from rlloom.core_rl.workers.precision import compute_autocast
from rlloom.core_rl.workers.weight_sync import bucket_names

RowLogprobs = tuple[list[int], torch.Tensor, torch.Tensor | None]


@dataclass(frozen=True)
class RankContext:
    """This process's place in the default process group."""

    rank: int
    world_size: int
    device: torch.device  # where collective buffers live: NCCL only reduces GPU tensors

    def rows(self, batch: TrajectoryBatch) -> list[int]:
        """This rank's rows of `batch`, balanced by token count; the same split on every rank."""
        counts = [int(n) for n in batch["attention_mask"].sum(-1).tolist()]
        return balance_rows(counts, self.world_size)[self.rank]

    def max_over_ranks(self, value: int) -> int:
        tensor = torch.tensor([value], dtype=torch.int64, device=self.device)
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
        return int(tensor.item())

    def sum_over_ranks(self, value: float) -> float:
        tensor = torch.tensor([value], dtype=torch.float64, device=self.device)
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        return float(tensor.item())

    def reduce_over_ranks(self, totals: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Each named scalar across ranks: the max for `*_max` names (`actor.combine_metric`), else the sum; one
        all-reduce per kind, in the same order on every rank (every rank has the same keys)."""
        out: dict[str, torch.Tensor] = {}
        maxima = sorted(k for k in totals if k.endswith(MAX_METRIC_SUFFIX))
        sums = sorted(k for k in totals if not k.endswith(MAX_METRIC_SUFFIX))
        for keys, op in ((sums, dist.ReduceOp.SUM), (maxima, dist.ReduceOp.MAX)):
            if keys:
                stacked = torch.stack([totals[k].detach().float().to(self.device).reshape(()) for k in keys])
                dist.all_reduce(stacked, op=op)
                out.update(zip(keys, stacked.cpu().unbind(), strict=True))
        return out

    def micro_batches(
        self, batch: TrajectoryBatch, *, max_tokens: int, padded: bool
    ) -> list[tuple[list[int], TrajectoryBatch, float]]:
        """(rows of `batch`, micro-batch, loss weight) for this rank, each micro-batch exactly one model forward,
        padded with weight-0 single-row micro-batches so that every rank runs the same number of forwards."""
        rows = self.rows(batch)
        real: list[tuple[list[int], TrajectoryBatch, float]] = []
        if rows:
            mine = batch.select(rows)
            for local_rows, micro in mine.micro_batches(max_tokens, padded=padded):
                # a vision-language row is forwarded on its own anyway (model_forward): it becomes a micro-batch of
                # its own, so each micro-batch is one forward and one backward, in step across ranks
                own = set(rope_rows(micro))
                text = [r for i, r in enumerate(local_rows) if i not in own]
                if text:
                    part = micro if not own else mine.select(text).trimmed()
                    real.append(([rows[r] for r in text], part, 1.0))
                real += [([rows[local_rows[i]]], mine.select([local_rows[i]]).trimmed(), 1.0) for i in sorted(own)]
        filler = batch.select([rows[0] if rows else 0])
        missing = self.max_over_ranks(len(real)) - len(real)
        return real + [([], filler, 0.0) for _ in range(missing)]


def rank_logprobs(
    model: nn.Module,
    batch: TrajectoryBatch,
    ctx: RankContext,
    *,
    temperature: float,
    max_tokens: int,
    packed: bool,
    entropy: bool,
    device: torch.device,
    bf16: bool,
) -> RowLogprobs:
    """No-grad log-probs (and entropies) of this rank's rows: (row indices, [rows, R], [rows, R] or None)."""
    width = batch.response_width
    rows: list[int] = []
    lp_parts: list[torch.Tensor] = []
    ent_parts: list[torch.Tensor] = []
    parts = [
        (part_rows, micro) for part_rows, micro, _ in ctx.micro_batches(batch, max_tokens=max_tokens, padded=not packed)
    ]
    for part_rows, lp, ent in micro_batch_logprobs(
        model, parts, temperature=temperature, packed=packed, entropy=entropy, device=device, bf16=bf16
    ):
        if not part_rows:  # a weight-0 filler run only to keep the collectives in step
            continue
        rows.extend(part_rows)
        lp_parts.append(_to_width(lp, width))
        if ent is not None:
            ent_parts.append(_to_width(ent, width))
    free_gathered_weights(model)
    empty = torch.zeros(0, width)
    logprobs = torch.cat(lp_parts) if lp_parts else empty
    entropies = (torch.cat(ent_parts) if ent_parts else empty) if entropy else None
    return rows, logprobs, entropies


def free_gathered_weights(model: nn.Module) -> None:
    """Drop the full-size copies FSDP2 leaves after a no-grad forward: it keeps the root's parameters (the
    embeddings, often the largest tensor) gathered, expecting a backward that inference never runs."""
    if isinstance(model, FSDPModule):
        model.reshard()


def full_training_state(worker: PolicyActor | ValueCritic) -> dict[str, Any]:
    """A sharded worker's optimizer, schedule and shuffling state, full size (every rank must call)."""
    return {
        "optimizer": full_optimizer_state(worker.optimizer),
        "scheduler": worker.scheduler.state_dict(),
        "generator": worker.generator.get_state(),
    }


def load_full_training_state(worker: PolicyActor | ValueCritic, state: Mapping[str, Any]) -> None:
    """Load a state saved by any number of ranks (or one process) into a sharded worker."""
    with configured_hyperparameters(worker.optimizer, worker.scheduler):  # the resumed config's lr and decay
        load_full_optimizer_state(worker.optimizer, state["optimizer"])
        worker.scheduler.load_state_dict(state["scheduler"])
    worker.generator.set_state(state["generator"])


def _to_width(values: torch.Tensor, width: int) -> torch.Tensor:
    """Micro-batches may be trimmed to their own longest response: pad back to the batch's response width."""
    if values.shape[-1] == width:
        return values
    return torch.nn.functional.pad(values, (0, width - values.shape[-1]))


class _TrainsOnRanks:
    """The training hooks of `PolicyActor` / `ValueCritic` for one rank: its own rows, padded with weight-0
    micro-batches to the common count, and metric totals summed over ranks."""

    ctx: RankContext
    cfg: Any  # the worker's ActorConfig or CriticConfig: its micro-batch budget and padding

    def _training_micro_batches(self, mini: TrajectoryBatch) -> list[tuple[TrajectoryBatch, float]]:
        parts = self.ctx.micro_batches(
            mini, max_tokens=self.cfg.max_tokens_per_micro_batch, padded=not self.cfg.padding_free
        )
        return [(micro, weight) for _, micro, weight in parts]

    def _reduce_over_ranks(self, totals: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return self.ctx.reduce_over_ranks(totals)

    def _micro_batch_count(self, micro_batches: list[tuple[TrajectoryBatch, float]]) -> float:
        """Micro-batches with rows on every rank together (weight-0 fillers excluded): TRL's bnpo divides by the
        accumulation steps and DDP averages over devices, i.e. by all micro-batches of all ranks."""
        return self.ctx.sum_over_ranks(float(sum(1 for _, weight in micro_batches if weight > 0)))


class ShardedPolicyActor(_TrainsOnRanks, PolicyActor):
    """`PolicyActor` on one rank of an FSDP2-sharded model. The driver (`RayActorGroup`) calls the same method on
    every rank with the whole batch and assembles the rows."""

    def __init__(self, model: nn.Module, ctx: RankContext, **kwargs: Any) -> None:
        super().__init__(model, **kwargs)  # type: ignore[arg-type]
        self.ctx = ctx
        # FSDP2 with two forwards (prompt, then responses) before one backward is not verified: full forwards here
        self.share_prompts = False
        self.lora_scalings = lora_scalings(model) if hasattr(model, "merge_and_unload") else None
        # with LoRA: each merged weight's source tensors (the names never change, so worked out once)
        self.lora_sources = lora_sources(model.state_dict(), self.lora_scalings) if self.lora_scalings else None

    def rank_logprobs(self, batch: TrajectoryBatch, *, temperature: float, entropy: bool = False) -> RowLogprobs:
        self.model.eval()
        return rank_logprobs(
            self.model,
            batch,
            self.ctx,
            temperature=temperature,
            max_tokens=self.cfg.max_tokens_per_micro_batch,
            packed=self.cfg.padding_free,
            entropy=entropy,
            device=self.device,
            bf16=self.bf16,
        )

    def named_weights(self) -> dict[str, torch.Tensor]:
        """Full weights at rank 0 (with LoRA: base + merged adapter, under HF names), an empty dict elsewhere
        (every rank must call)."""
        state = full_model_state(self.model)
        if self.lora_scalings is None or not state:
            return state
        return merge_lora_state(state, self.lora_scalings)

    def weight_bucket_plan(self, bucket_bytes: int) -> list[list[str]]:
        """Weight names (HF names; merged ones with LoRA) grouped into buckets of at most `bucket_bytes` at full
        size (the same on every rank)."""
        sizes = full_tensor_sizes(self.model)
        if self.lora_sources is not None:
            sizes = {merged: sizes[parts[0]] for merged, parts in self.lora_sources.items()}
        return bucket_names(sizes, bucket_bytes)

    def gather_weights(self, names: list[str]) -> dict[str, torch.Tensor]:
        """One bucket of full weights at rank 0, an empty dict elsewhere (every rank must call)."""
        if self.lora_scalings is None or self.lora_sources is None:
            return gather_full_tensors(self.model, names)
        state = gather_full_tensors(self.model, [part for name in names for part in self.lora_sources[name]])
        return merge_lora_state(state, self.lora_scalings) if state else {}

    def save_pretrained(self, path: str) -> None:
        """Gather the weights; rank 0 writes them in Hugging Face format (every rank must call)."""
        weights = full_model_state(self.model)
        if self.ctx.rank == 0:
            if self.lora_scalings is None:
                self.model.save_pretrained(path, state_dict=weights)  # type: ignore[operator]
            else:  # as PolicyActor: the merged model at `path`, the adapter in `path/adapter` to resume from
                base = self.model.get_base_model()  # type: ignore[operator]
                base.save_pretrained(path, state_dict=merge_lora_state(weights, self.lora_scalings))
                self.model.save_pretrained(str(Path(path) / ADAPTER_DIR), state_dict=weights)  # type: ignore[operator]
        dist.barrier()

    def state_dict(self) -> dict[str, Any]:
        """Full-size optimizer state in the single-process layout, so any number of ranks can resume it."""
        return full_training_state(self)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        load_full_training_state(self, state)


class ShardedReference(ReferencePolicy):
    """`ReferencePolicy` on one rank of an FSDP2-sharded frozen model."""

    def __init__(self, model: nn.Module, ctx: RankContext, **kwargs: Any) -> None:
        super().__init__(model, **kwargs)
        self.ctx = ctx

    def rank_logprobs(self, batch: TrajectoryBatch, *, temperature: float, entropy: bool = False) -> RowLogprobs:
        """With LoRA the model is the actor's own: the adapter is switched off around the forwards, so these are
        the base model's log-probs (as `ReferencePolicy.compute_logprobs`), not the current policy's."""
        with self._base_model():
            self.model.eval()
            return rank_logprobs(
                self.model,
                batch,
                self.ctx,
                temperature=temperature,
                max_tokens=self.max_tokens,
                packed=self.packed,
                entropy=entropy,
                device=self.device,
                bf16=self.bf16,
            )


class ShardedCritic(_TrainsOnRanks, ValueCritic):
    """`ValueCritic` on one rank of an FSDP2-sharded value model (backbone + head)."""

    def __init__(self, model: nn.Module, ctx: RankContext, **kwargs: Any) -> None:
        super().__init__(model, **kwargs)  # type: ignore[arg-type]
        self.ctx = ctx

    def rank_values(self, batch: TrajectoryBatch) -> tuple[list[int], torch.Tensor]:
        """No-grad values of this rank's rows: (row indices, [rows, R])."""
        self.model.eval()
        width = batch.response_width
        rows: list[int] = []
        parts: list[torch.Tensor] = []
        padded = not self.cfg.padding_free
        with torch.no_grad():
            for micro_rows, micro, weight in self.ctx.micro_batches(
                batch, max_tokens=self.cfg.max_tokens_per_micro_batch, padded=padded
            ):
                with compute_autocast(self.device, self.bf16):
                    values = self.model(micro.to(self.device), packed=self.cfg.padding_free)
                if weight != 0.0:
                    rows.extend(micro_rows)
                    parts.append(_to_width(values.float().cpu(), width))
        free_gathered_weights(self.model)
        return rows, torch.cat(parts) if parts else torch.zeros(0, width)

    def save_pretrained(self, path: str) -> None:
        weights = full_model_state(self.model)
        if self.ctx.rank == 0:
            self.model.save_pretrained(path, state_dict=weights)
        dist.barrier()

    def state_dict(self) -> dict[str, Any]:
        """Full-size optimizer state in the single-process layout, so any number of ranks can resume it."""
        return full_training_state(self)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        load_full_training_state(self, state)


__all__ = [
    "RankContext",
    "RowLogprobs",
    "ShardedCritic",
    "ShardedPolicyActor",
    "ShardedReference",
    "rank_logprobs",
]
