"""In-process critic: the language model's backbone with a scalar value head (implements `CriticWorker`).

The backbone is loaded with `AutoModel` from the policy's checkpoint (the LM head is not needed), and the head
is a zero-initialised linear layer, so the first values are 0 and the first advantages are plain returns. Saved as
an HF backbone directory plus `value_head.safetensors`.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import AutoModel, PreTrainedModel

from rlloom.core_rl.algorithms import LossAggregation, token_and_seq_counts, value_loss
from rlloom.core_rl.config.schema import CriticConfig, ModelConfig
from rlloom.core_rl.contracts.batch import TrajectoryBatch, scatter_rows
from rlloom.core_rl.workers.attention import model_attn_implementation
from rlloom.core_rl.workers.dropout import disable_dropout
from rlloom.core_rl.workers.forward import response_hidden_states
from rlloom.core_rl.workers.optim import (
    build_optimizer,
    clipped_optimizer_step,
    load_training_state,
    ppo_minibatches,
    training_state,
)
from rlloom.core_rl.workers.precision import compute_autocast, load_dtype

VALUE_HEAD_FILE = "value_head.safetensors"


class ValueModel(nn.Module):
    """Backbone + linear value head; `forward(batch)` gives values `[b, R]` for the response tokens."""

    def __init__(self, backbone: PreTrainedModel) -> None:
        super().__init__()
        self.backbone = backbone
        self.value_head = nn.Linear(backbone.config.get_text_config().hidden_size, 1)  # VLMs nest it
        nn.init.zeros_(self.value_head.weight)
        nn.init.zeros_(self.value_head.bias)

    @classmethod
    def from_pretrained(cls, cfg: ModelConfig, path: str, device: torch.device | None = None) -> ValueModel:
        """`device`: where the model will run, which decides `model.attn_implementation: auto` (None: CPU); the
        model loads on the CPU either way."""
        # trained: fp32 master weights under bf16 compute, as the actor (model.param_dtype)
        dtype = load_dtype(cfg, trained=True)
        attn = model_attn_implementation(cfg, device if device is not None else torch.device("cpu"))
        backbone = AutoModel.from_pretrained(path, dtype=dtype, attn_implementation=attn)
        if cfg.disable_dropout:
            disable_dropout(backbone)
        if cfg.gradient_checkpointing:
            backbone.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model = cls(backbone)
        head = Path(path) / VALUE_HEAD_FILE
        if head.exists():
            model.value_head.load_state_dict(load_file(str(head)))
        return model

    def forward(self, batch: TrajectoryBatch, *, packed: bool = False) -> torch.Tensor:
        hidden = response_hidden_states(self.backbone, batch, packed=packed)
        values = self.value_head(hidden.to(self.value_head.weight.dtype)).squeeze(-1).float()
        mask = batch.response_attention_mask.bool()
        return torch.where(mask, values, torch.zeros_like(values))

    @property
    def _no_split_modules(self) -> list[str]:
        """The backbone's decoder-layer classes (FSDP2 wraps each as a unit)."""
        return list(getattr(self.backbone, "_no_split_modules", None) or [])

    def save_pretrained(self, path: str, state_dict: Mapping[str, torch.Tensor] | None = None) -> None:
        """The backbone as an HF directory plus the head; `state_dict` (keys `backbone.*`, `value_head.*`) stands
        in for the module's own tensors, e.g. the full weights gathered from FSDP2 shards."""
        state = dict(state_dict) if state_dict is not None else dict(self.state_dict())
        backbone = {k.removeprefix("backbone."): v for k, v in state.items() if k.startswith("backbone.")}
        head = {k.removeprefix("value_head."): v for k, v in state.items() if k.startswith("value_head.")}
        self.backbone.save_pretrained(path, state_dict=backbone)
        save_file({k: v.detach().contiguous().cpu() for k, v in head.items()}, str(Path(path) / VALUE_HEAD_FILE))


class ValueCritic:
    """Trains `ValueModel` with PPO's clipped value loss."""

    def __init__(
        self,
        model: ValueModel,
        *,
        critic: CriticConfig,
        loss_agg_mode: str,
        total_steps: int,
        mini_batch_rows: int,
        device: torch.device,
        bf16: bool = False,
        seed: int = 0,
    ) -> None:
        self.model = model.to(device)
        self.cfg = critic
        self.loss_agg_mode = loss_agg_mode
        self.device = device
        self.bf16 = bf16
        self.mini_batch_rows = mini_batch_rows
        self.optimizer, self.scheduler = build_optimizer(model.parameters(), critic, total_steps)
        self.generator = torch.Generator().manual_seed(seed + 1)

    def compute_values(self, batch: TrajectoryBatch) -> torch.Tensor:
        self.model.eval()
        parts = []
        with torch.no_grad():
            budget = self.cfg.max_tokens_per_micro_batch
            for rows, micro in batch.micro_batches(budget, padded=not self.cfg.padding_free):
                with compute_autocast(self.device, self.bf16):
                    values = self.model(micro.to(self.device), packed=self.cfg.padding_free)
                parts.append((rows, values.float().cpu()))
        return scatter_rows(parts, batch.batch_size, batch.response_width)

    def update_critic(self, batch: TrajectoryBatch) -> dict[str, float]:
        for key in ("values", "returns"):
            if key not in batch.tensors:
                raise KeyError(f"update_critic: the batch lacks {key!r}; compute it before the update")
        self.model.train()
        sums: dict[str, float] = {}
        n_updates = 0
        for mini in ppo_minibatches(
            batch, self.mini_batch_rows, epochs=self.cfg.ppo_epochs, shuffle=self.cfg.shuffle, generator=self.generator
        ):
            for key, value in self._update_minibatch(mini).items():
                sums[key] = sums.get(key, 0.0) + value
            n_updates += 1
        metrics = {f"critic/{k}": v / max(n_updates, 1) for k, v in sums.items()}
        metrics["critic/lr"] = float(self.scheduler.get_last_lr()[0])  # the rate these updates used
        self.scheduler.step()
        return metrics

    def _update_minibatch(self, mini: TrajectoryBatch) -> dict[str, float]:
        tokens, seqs = token_and_seq_counts(mini.loss_mask)
        micro_batches = self._training_micro_batches(mini)
        agg = LossAggregation(
            self.loss_agg_mode,
            global_token_count=float(tokens.clamp(min=1)),
            global_seq_count=float(seqs.clamp(min=1)),
            global_micro_batch_count=self._micro_batch_count(micro_batches) if self.loss_agg_mode == "bnpo" else None,
        )
        totals: dict[str, torch.Tensor] = {}
        for micro, weight in micro_batches:
            micro = micro.to(self.device)
            with compute_autocast(self.device, self.bf16):
                values = self.model(micro, packed=self.cfg.padding_free)
            loss, metrics = value_loss(
                values, micro["values"], micro["returns"], micro.loss_mask, clip=self.cfg.value_clip, agg=agg
            )
            (loss * weight).backward()  # type: ignore[no-untyped-call]
            share = micro.loss_mask.sum() / float(tokens.clamp(min=1))
            for key, value in {"vf_loss": loss.detach(), **{k: v * share for k, v in metrics.items()}}.items():
                totals[key] = totals[key] + value * weight if key in totals else value * weight
        totals = self._reduce_over_ranks(totals)
        grad_norm = clipped_optimizer_step(self.model.parameters(), self.optimizer, self.cfg.grad_clip)
        out = {k: float(v) for k, v in totals.items()}
        out["grad_norm"] = float(grad_norm)
        return out

    def _training_micro_batches(self, mini: TrajectoryBatch) -> list[tuple[TrajectoryBatch, float]]:
        """The micro-batches this process runs for `mini` with their loss weights (see `PolicyActor`)."""
        padded = not self.cfg.padding_free
        return [(micro, 1.0) for _, micro in mini.micro_batches(self.cfg.max_tokens_per_micro_batch, padded=padded)]

    def _reduce_over_ranks(self, totals: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return totals

    def _micro_batch_count(self, micro_batches: list[tuple[TrajectoryBatch, float]]) -> float:
        """Micro-batches of the mini-batch that carry rows (`bnpo`'s divisor): all of them ran in this process."""
        return float(sum(1 for _, weight in micro_batches if weight > 0))

    def save_pretrained(self, path: str) -> None:
        self.model.save_pretrained(path)

    def state_dict(self) -> dict[str, Any]:
        return training_state(self.optimizer, self.scheduler, self.generator)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        load_training_state(state, self.optimizer, self.scheduler, self.generator)
