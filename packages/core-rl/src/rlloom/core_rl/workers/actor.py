"""In-process policy and reference workers: any Hugging Face causal LM from a local path.

`PolicyActor` implements `PolicyWorker`: log-probs in token-budget micro-batches, and PPO epochs over
mini-batches with gradient accumulation whose losses are normalised by the mini-batch's global token and
sequence counts (so micro-batching never changes the gradient), an entropy bonus, a KL loss, TIS weights, the
PPO-ptx language-model loss, grad-norm clipping and an AdamW step. `ReferencePolicy` is a frozen copy or, with
LoRA, the actor's own base model with the adapter disabled.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, cast

import torch
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText, PreTrainedModel
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

from rlloom.core_rl.algorithms import (
    LossAggregation,
    PolicyLossFn,
    aggregate_with,
    get_policy_loss,
    kl_penalty,
    masked_mean,
    mismatch_metrics,
    token_and_seq_counts,
)
from rlloom.core_rl.config.schema import ActorConfig, AlgorithmConfig, ConfigError, ModelConfig
from rlloom.core_rl.contracts.batch import TrajectoryBatch, scatter_rows
from rlloom.core_rl.observe import progress
from rlloom.core_rl.run.sharded_checkpoint import refuse_sharded
from rlloom.core_rl.workers.attention import model_attn_implementation
from rlloom.core_rl.workers.dropout import disable_dropout
from rlloom.core_rl.workers.forward import response_logprobs
from rlloom.core_rl.workers.optim import (
    build_optimizer,
    clipped_optimizer_step,
    load_training_state,
    ppo_minibatches,
    single_optimizer_step,
    training_state,
)
from rlloom.core_rl.workers.precision import compute_autocast, load_dtype
from rlloom.core_rl.workers.supervised import supervised_nll_sum

ADAPTER_DIR = "adapter"
MAX_METRIC_SUFFIX = "_max"
"""Update metrics named so are maxima: micro-batches and ranks combine them by max; all others are summed."""


def combine_metric(key: str, total: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """Fold one micro-batch's metric into the running total: max for `*_max` names, sum otherwise."""
    return torch.maximum(total, value) if key.endswith(MAX_METRIC_SUFFIX) else total + value


def load_causal_lm(
    cfg: ModelConfig,
    path: str,
    device: torch.device,
    *,
    resume_from: Path | None = None,
    seed: int = 0,
    trained: bool = True,
) -> PreTrainedModel:
    """Load a causal LM for training from `path`; with `cfg.lora_rank > 0`, wrap `cfg.path` in LoRA adapters
    (new ones, initialised from `seed` so every process and every run starts from the same adapter, or those
    saved under `resume_from/adapter`). A vision-language checkpoint (e.g. Qwen2.5-VL) loads as its
    image-text-to-text class, see `model_class`.

    Trained weights load in the parameter dtype (fp32 master weights unless `model.param_dtype` says otherwise);
    a model that is never trained (`trained=False`: a reference, an engine's copy) and LoRA's frozen base load in
    the compute dtype `model.dtype` (see `precision`)."""
    dtype = load_dtype(cfg, trained=trained and cfg.lora_rank == 0)
    refuse_sharded(Path(path), "model weights")
    base_path = cfg.path if cfg.lora_rank > 0 else path
    model: PreTrainedModel = model_class(base_path).from_pretrained(
        base_path, dtype=dtype, attn_implementation=model_attn_implementation(cfg, device)
    )
    if cfg.disable_dropout:
        disable_dropout(model)
    if cfg.freeze_vision_tower:
        freeze_vision_tower(model)
    if cfg.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if cfg.lora_rank > 0:
        try:
            from peft import LoraConfig, PeftModel, get_peft_model
        except ImportError as err:  # pragma: no cover - depends on the extra
            raise ImportError("model.lora_rank > 0 needs peft: pip install 'rlloom-core-rl[lora]'") from err
        if resume_from is not None:
            peft_model = PeftModel.from_pretrained(model, str(resume_from / ADAPTER_DIR), is_trainable=True)
        else:
            lora = LoraConfig(r=cfg.lora_rank, lora_alpha=cfg.lora_alpha, target_modules=cfg.lora_target_modules)
            with torch.random.fork_rng(devices=[]):  # peft draws lora_A from the global RNG
                torch.manual_seed(seed)
                peft_model = get_peft_model(model, lora)
        model = cast(PreTrainedModel, peft_model)  # a PeftModel forwards the PreTrainedModel interface
    nn.Module.to(model, device)  # transformers wraps `.to` with a signature mypy cannot follow
    return model


VISION_TOWER_NAMES = ("visual", "vision_tower", "vision_model")
"""What vision-language models call their image encoder (Qwen2/2.5-VL: `visual`; LLaVA-style: `vision_tower`)."""


def freeze_vision_tower(model: nn.Module) -> int:
    """Stop gradients to the vision encoder (EasyR1's `freeze_vision_tower`): its parameters get no gradient, so
    AdamW leaves them as they are. Returns how many parameter values were frozen."""
    towers = [m for name, m in model.named_modules() if name.rsplit(".", 1)[-1] in VISION_TOWER_NAMES]
    if not towers:
        names = " / ".join(VISION_TOWER_NAMES)
        raise ConfigError(
            f"model.freeze_vision_tower: the model has no vision tower (no module named {names}); it is for "
            "vision-language models: set model.freeze_vision_tower=false"
        )
    frozen = 0
    for tower in towers:
        for param in tower.parameters():
            param.requires_grad_(False)
            frozen += param.numel()
    return frozen


def model_class(path: str) -> Any:
    """`AutoModelForCausalLM`, or `AutoModelForImageTextToText` for a config that causal-LM auto-loading does not
    know and that has a `vision_config` (transformers 5 maps `qwen2_5_vl` / `qwen2_vl` only there). Both give a
    model whose forward takes `input_ids` and returns next-token `logits`, which is all the actor needs."""
    config = AutoConfig.from_pretrained(path)
    if type(config) in MODEL_FOR_CAUSAL_LM_MAPPING or getattr(config, "vision_config", None) is None:
        return AutoModelForCausalLM
    return AutoModelForImageTextToText


def micro_batch_logprobs(
    model: nn.Module,
    parts: Iterable[tuple[list[int], TrajectoryBatch]],
    *,
    temperature: float,
    packed: bool,
    entropy: bool,
    device: torch.device,
    bf16: bool,
    share_prompts: bool = False,
) -> Iterator[tuple[list[int], torch.Tensor, torch.Tensor | None]]:
    """No-grad log-probs (and entropies) of each (rows, micro-batch): (rows, `[rows, r]` on CPU, entropies);
    `bf16`: compute in bf16 (`precision.compute_autocast`); `share_prompts` as in `response_logprobs`."""
    for rows, micro in parts:
        with torch.no_grad(), compute_autocast(device, bf16):
            lp, ent = response_logprobs(
                model,
                micro.to(device),
                temperature=temperature,
                packed=packed,
                entropy=entropy,
                share_prompts=share_prompts,
            )
        yield rows, lp.float().cpu(), None if ent is None else ent.float().cpu()


def logprobs_in_micro_batches(
    model: nn.Module,
    batch: TrajectoryBatch,
    *,
    temperature: float,
    max_tokens: int,
    packed: bool,
    entropy: bool,
    device: torch.device,
    bf16: bool,
    share_prompts: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """No-grad log-probs (and entropies) of every response token, micro-batched by token budget."""
    lp_parts, ent_parts = [], []
    parts = batch.micro_batches(max_tokens, padded=not packed)
    for rows, lp, ent in micro_batch_logprobs(
        model,
        parts,
        temperature=temperature,
        packed=packed,
        entropy=entropy,
        device=device,
        bf16=bf16,
        share_prompts=share_prompts,
    ):
        lp_parts.append((rows, lp))
        if ent is not None:
            ent_parts.append((rows, ent))
    width = batch.response_width
    logprobs = scatter_rows(lp_parts, batch.batch_size, width)
    return logprobs, scatter_rows(ent_parts, batch.batch_size, width) if ent_parts else None


class PolicyActor:
    """The trainable policy (implements `PolicyWorker`). `bf16`: forwards and backwards compute in bf16 under
    autocast on any device, while the optimizer steps the parameters in their own dtype (fp32 master weights when
    loaded by `load_causal_lm`, see `precision`)."""

    def __init__(
        self,
        model: PreTrainedModel,
        *,
        actor: ActorConfig,
        algorithm: AlgorithmConfig,
        total_steps: int,
        mini_batch_rows: int,
        max_response_length: int,
        device: torch.device,
        bf16: bool = False,
        seed: int = 0,
    ) -> None:
        self.model = model
        self.cfg = actor
        self.algo = algorithm
        self.device = device
        self.bf16 = bf16
        self.mini_batch_rows = mini_batch_rows
        self.max_response_length = max_response_length
        self.optimizer, self.scheduler = build_optimizer(model.parameters(), actor, total_steps)
        loss: Callable[..., Any] = get_policy_loss(algorithm.policy_loss.name)
        settings = algorithm.policy_loss.kwargs  # the loss's own knobs (checked against its signature at load)
        self.policy_loss = cast(PolicyLossFn, functools.partial(loss, **settings) if settings else loss)
        self.generator = torch.Generator().manual_seed(seed)
        self.share_prompts = actor.share_prompt_forward

    def compute_logprobs(
        self, batch: TrajectoryBatch, *, temperature: float, entropy: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        self.model.eval()
        return logprobs_in_micro_batches(
            self.model,
            batch,
            temperature=temperature,
            max_tokens=self.cfg.max_tokens_per_micro_batch,
            packed=self.cfg.padding_free,
            entropy=entropy,
            device=self.device,
            bf16=self.bf16,
            share_prompts=self.share_prompts,
        )

    def update_policy(
        self,
        batch: TrajectoryBatch,
        *,
        temperature: float = 1.0,
        entropy_coef: float | None = None,
        ptx_batch: Callable[[], TrajectoryBatch] | None = None,
    ) -> dict[str, float]:
        """PPO epochs; needs `advantages` (plus `ref_logprobs` with a KL loss) and `old_logprobs`, except when the
        batch gets a single optimizer step (`single_update`): then the update's own log-probs, detached, are the old
        ones, and the diagnostics the trainer would take from a separate old-log-prob forward (entropy, KL to the
        reference, rollout mismatch) come back with the update's metrics. `entropy_coef` overrides
        `algorithm.entropy.coef` for these updates (adaptive entropy control sets it every step). `ptx_batch` gives
        the next PPO-ptx batch; it is called once per optimizer step while `algorithm.ptx` is set."""
        coef = self.algo.entropy.coef if entropy_coef is None else float(entropy_coef)
        for key in ("advantages", *(("ref_logprobs",) if self.algo.kl.use_loss else ())):
            if key not in batch.tensors:
                raise KeyError(f"update_policy: the batch lacks {key!r}; compute it before the update")
        if "old_logprobs" not in batch.tensors and not self.single_update(batch.batch_size):
            raise KeyError(
                f"update_policy: the batch lacks 'old_logprobs', which {self.cfg.ppo_epochs} epoch(s) over "
                f"{batch.batch_size} rows in mini-batches of {self.mini_batch_rows} need (more than one optimizer "
                "step); compute them with compute_logprobs before the update"
            )
        self.model.train()
        sums: dict[str, float] = {}
        n_updates = 0
        total = self.cfg.ppo_epochs * -(-batch.batch_size // self.mini_batch_rows)  # what ppo_minibatches yields
        for mini in ppo_minibatches(
            batch, self.mini_batch_rows, epochs=self.cfg.ppo_epochs, shuffle=self.cfg.shuffle, generator=self.generator
        ):
            for key, value in self._update_minibatch(mini, temperature, coef, ptx_batch).items():
                sums[key] = sums.get(key, 0.0) + value
            n_updates += 1
            progress.advance(total=total, unit="mini-batch")  # `[update_actor] mini-batch i/n` every few seconds
        metrics = {k if "/" in k else f"actor/{k}": v / max(n_updates, 1) for k, v in sums.items()}
        metrics["actor/lr"] = float(self.scheduler.get_last_lr()[0])  # the rate these updates used
        self.scheduler.step()
        metrics["actor/optimizer_steps"] = float(n_updates)
        return metrics

    def single_update(self, rows: int) -> bool:
        """Whether `rows` rows get exactly one optimizer step here (`optim.single_optimizer_step`)."""
        return single_optimizer_step(rows, self.mini_batch_rows, epochs=self.cfg.ppo_epochs)

    def _update_minibatch(
        self,
        mini: TrajectoryBatch,
        temperature: float,
        entropy_coef: float,
        ptx_batch: Callable[[], TrajectoryBatch] | None = None,
    ) -> dict[str, float]:
        tokens, seqs = token_and_seq_counts(mini.loss_mask)
        micro_batches = self._training_micro_batches(mini)
        agg = LossAggregation(
            self.algo.policy_loss.agg_mode,
            global_token_count=float(tokens.clamp(min=1)),
            global_seq_count=float(seqs.clamp(min=1)),
            norm_length=float(self.max_response_length),
            global_micro_batch_count=self._micro_batch_count(micro_batches)
            if self.algo.policy_loss.agg_mode == "bnpo"
            else None,
        )
        totals: dict[str, torch.Tensor] = {}
        for micro, weight in micro_batches:
            micro = micro.to(self.device)
            for key, value in self._micro_loss(micro, agg, temperature, entropy_coef, weight).items():
                totals[key] = combine_metric(key, totals[key], value) if key in totals else value
        if ptx_batch is not None and self.algo.ptx is not None:
            totals["ptx_loss"] = self._ptx_backward(ptx_batch())
        totals = self._reduce_over_ranks(totals)
        grad_norm = clipped_optimizer_step(self.model.parameters(), self.optimizer, self.cfg.grad_clip)
        out = {k: float(v) for k, v in totals.items()}
        out["grad_norm"] = float(grad_norm)
        out["grad_norm_nonfinite"] = float(not torch.isfinite(grad_norm))
        # metric means were accumulated weighted by each micro-batch's share of tokens
        return out

    def _ptx_backward(self, ptx: TrajectoryBatch) -> torch.Tensor:
        """PPO-ptx (InstructGPT's pretraining mix): backpropagate ptx_coef x the mean NLL of `ptx`'s trained tokens
        into the gradients the policy loss left, micro-batch by micro-batch (each part divided by the whole batch's
        token count), so the optimizer step follows policy-gradient grad + ptx_coef x NLL grad. Returns the NLL."""
        tokens = float(ptx.loss_mask.sum())
        if tokens == 0:
            raise ValueError("PPO-ptx: the batch has no trained token; every algorithm.ptx.files row needs one")
        assert self.algo.ptx is not None
        coef = self.algo.ptx.coef
        nll = torch.zeros((), device=self.device)
        for _, micro in ptx.micro_batches(self.cfg.max_tokens_per_micro_batch, padded=not self.cfg.padding_free):
            with compute_autocast(self.device, self.bf16):
                part = supervised_nll_sum(self.model, micro.to(self.device), packed=self.cfg.padding_free) / tokens
            (coef * part).backward()  # type: ignore[no-untyped-call]
            nll = nll + part.detach()
        return nll

    def _training_micro_batches(self, mini: TrajectoryBatch) -> list[tuple[TrajectoryBatch, float]]:
        """The micro-batches this process runs for `mini`, each with its loss weight (a data-parallel rank takes
        its own rows and may add zero-weight ones so every rank runs the same number of forwards)."""
        padded = not self.cfg.padding_free
        return [(micro, 1.0) for _, micro in mini.micro_batches(self.cfg.max_tokens_per_micro_batch, padded=padded)]

    def _reduce_over_ranks(self, totals: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Metric totals of the whole mini-batch: here this process saw all of it."""
        return totals

    def _micro_batch_count(self, micro_batches: list[tuple[TrajectoryBatch, float]]) -> float:
        """Micro-batches of the mini-batch that carry rows (`bnpo`'s divisor): here all of them ran in this process."""
        return float(sum(1 for _, weight in micro_batches if weight > 0))

    def _micro_loss(
        self,
        micro: TrajectoryBatch,
        agg: LossAggregation,
        temperature: float,
        entropy_coef: float,
        weight: float = 1.0,
    ) -> dict[str, torch.Tensor]:
        mask = micro.loss_mask
        on_policy = "old_logprobs" not in micro.tensors  # update_policy checked this is a single optimizer step
        with compute_autocast(self.device, self.bf16):
            logprobs, entropy = response_logprobs(
                self.model,
                micro,
                temperature=temperature,
                packed=self.cfg.padding_free,
                entropy=entropy_coef > 0 or on_policy,
                share_prompts=self.share_prompts,
                scored=mask != 0 if self.cfg.restrict_lm_head else None,
            )
        old_logprobs = logprobs.detach() if on_policy else micro["old_logprobs"]
        weights = micro["is_weights"] if "is_weights" in micro.tensors else None
        pg_loss, pg_metrics = self.policy_loss(
            logprobs,
            old_logprobs,
            micro["advantages"],
            mask,
            clip_low=self.algo.policy_loss.clip_low,
            clip_high=self.algo.policy_loss.clip_high,
            dual_clip=self.algo.policy_loss.dual_clip,
            agg=agg,
            rollout_is_weights=weights,
        )
        loss = pg_loss
        share = mask.sum() / agg.global_token_count  # type: ignore[operator]
        out: dict[str, torch.Tensor] = {"pg_loss": pg_loss.detach()}
        out.update({k: v * share for k, v in pg_metrics.items()})
        if entropy is not None and entropy_coef > 0:
            entropy_loss = aggregate_with(entropy, mask, agg)
            loss = loss - entropy_coef * entropy_loss
            out["entropy_loss"] = entropy_loss.detach()
        if self.algo.kl.use_loss:
            kl = kl_penalty(logprobs, micro["ref_logprobs"], self.algo.kl.loss_type)
            kl_loss = aggregate_with(kl, mask, agg)
            loss = loss + self.algo.kl.loss_coef * kl_loss
            out["kl_loss"] = kl_loss.detach()
            out["kl_mean"] = masked_mean(kl.detach(), mask) * share
        if on_policy:
            out.update(self._on_policy_diagnostics(micro, old_logprobs, entropy, share))
        (loss * weight).backward()  # type: ignore[no-untyped-call]
        out["loss"] = loss.detach()
        return {key: value * weight for key, value in out.items()} if weight != 1.0 else out

    def _on_policy_diagnostics(
        self, micro: TrajectoryBatch, logprobs: torch.Tensor, entropy: torch.Tensor | None, share: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        """What the trainer reports from a separate old-log-prob forward, taken here from the update's own
        (detached) log-probs: entropy, KL to the reference, rollout mismatch. Each mean is this micro-batch's
        masked mean times its share of the mini-batch's tokens, so the sum over micro-batches is the mini-batch
        mean; the mismatch maximum is combined by max (`combine_metric`)."""
        mask = micro.loss_mask
        out: dict[str, torch.Tensor] = {}
        if entropy is not None:
            out["entropy"] = masked_mean(entropy.detach(), mask) * share
        if "ref_logprobs" in micro.tensors and not self.algo.kl.use_loss:
            kl = kl_penalty(logprobs, micro["ref_logprobs"], self.algo.kl.loss_type)
            out["kl_mean"] = masked_mean(kl, mask) * share
        if "rollout_logprobs" in micro.tensors:
            mismatch = mismatch_metrics(logprobs, micro["rollout_logprobs"], mask)
            for key, value in mismatch.items():
                out[f"mismatch/{key}"] = value if key.endswith(MAX_METRIC_SUFFIX) else value * share
        return out

    def state_bytes(self) -> dict[str, int]:
        """Bytes this process keeps between steps for parameters and optimizer state: its own shard when the model
        is FSDP2-sharded (`to_local`), so the figure shows what sharding saves per rank. (Gradients exist only
        during an update and shard like the parameters.)"""

        def local_bytes(tensor: torch.Tensor | None) -> int:
            if tensor is None:
                return 0
            local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
            return int(local.numel() * local.element_size())

        params = list(self.model.parameters())
        moments = [v for state in self.optimizer.state.values() for v in state.values() if isinstance(v, torch.Tensor)]
        return {
            "parameters": sum(local_bytes(p) for p in params),
            "optimizer": sum(local_bytes(v) for v in moments),
        }

    def named_weights(self) -> Mapping[str, torch.Tensor]:
        if hasattr(self.model, "merge_and_unload"):
            # LoRA: engines load plain HF weights, so send base + merged adapter deltas
            return _merged_lora_weights(self.model)
        return dict(self.model.state_dict())

    def save_pretrained(self, path: str) -> None:
        """HF weights at `path`; with LoRA, the merged model there and the adapter in `path/adapter`."""
        if hasattr(self.model, "merge_and_unload"):
            base = self.model.get_base_model()  # type: ignore[operator]
            base.save_pretrained(path, state_dict=_merged_lora_weights(self.model))
            self.model.save_pretrained(str(Path(path) / ADAPTER_DIR))
        else:
            self.model.save_pretrained(path)

    def state_dict(self) -> dict[str, Any]:
        return training_state(self.optimizer, self.scheduler, self.generator)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        load_training_state(state, self.optimizer, self.scheduler, self.generator)


def _merged_lora_weights(model: nn.Module) -> dict[str, torch.Tensor]:
    """Base-model weights with LoRA deltas folded in, under the base model's HF names.

    Computed as new tensors, W + delta rounded to W's dtype (what peft's merge writes), never by merging into the model
    and unmerging: W + BA - BA is not W in floating point, so that would nudge the frozen base (and with it the
    LoRA reference) at every weight sync, by up to a bf16 rounding step.
    """
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model()  # type: ignore[operator]
    weights = {
        k.replace(".base_layer", ""): v.detach().clone() for k, v in base.state_dict().items() if "lora_" not in k
    }
    with torch.no_grad():
        for name, module in base.named_modules():
            if not isinstance(module, LoraLayer) or module.merged:
                continue
            adapters = [a for a in module.active_adapters if a in module.lora_A or a in module.lora_embedding_A]
            if not adapters:
                continue
            key = f"{name}.weight"
            delta = sum(module.get_delta_weight(a) for a in adapters)  # type: ignore[attr-defined]  # on subclasses
            # added in the promoted dtype and rounded once, as peft's in-place merge does (adapters stay fp32)
            weights[key] = (weights[key] + delta).to(weights[key].dtype)
    return weights


class ReferencePolicy:
    """Frozen reference log-probs (implements `ReferenceWorker`); `bf16` as for `PolicyActor`."""

    def __init__(
        self,
        model: nn.Module,
        *,
        max_tokens: int,
        packed: bool,
        device: torch.device,
        bf16: bool = False,
        share_prompts: bool = False,
    ) -> None:
        self.model = model
        self.max_tokens = max_tokens
        self.packed = packed
        self.share_prompts = share_prompts
        self.device = device
        self.bf16 = bf16
        self._lora = hasattr(model, "disable_adapter")
        if not self._lora:
            for p in model.parameters():
                p.requires_grad_(False)
            model.eval()

    def compute_logprobs(
        self, batch: TrajectoryBatch, *, temperature: float, entropy: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        with self._base_model():
            self.model.eval()
            return logprobs_in_micro_batches(
                self.model,
                batch,
                temperature=temperature,
                max_tokens=self.max_tokens,
                packed=self.packed,
                entropy=entropy,
                device=self.device,
                bf16=self.bf16,
                share_prompts=self.share_prompts,
            )

    @torch.no_grad()
    def mix_from(self, policy: nn.Module, alpha: float) -> None:
        """ref ← alpha · policy + (1 − alpha) · ref, parameter by parameter (TR-DPO's soft reference update)."""
        if self._lora:
            raise RuntimeError("a LoRA reference is the adapter-free base model; it cannot move toward the policy")
        source = dict(policy.named_parameters())
        for name, param in self.model.named_parameters():
            if name not in source:
                raise KeyError(f"the policy has no parameter {name!r} to mix into the reference")
            param.mul_(1.0 - alpha).add_(source[name].detach().to(param.dtype), alpha=alpha)

    @contextlib.contextmanager
    def _base_model(self) -> Iterator[None]:
        if self._lora:
            with self.model.disable_adapter():  # type: ignore[operator]
                yield
        else:
            yield
