"""GPU check: the parts of rlloom that only a GPU exercises, in one run of under 8 minutes on one H100/H200.

Checks (each prints PASS/FAIL/SKIP with its figures; the run writes a JSON report):
  env                  torch / CUDA / NCCL versions, the device and its bf16 dense peak
  fsdp2_api            the FSDP2 and DTensor calls `distributed/fsdp.py` and `ranks.py` make exist on this torch
  nccl_vs_inprocess    a 1-rank FSDP2 actor (NCCL process group started in-process over tcp://127.0.0.1, no Ray)
                       against the in-process `PolicyActor` on a Qwen2.5-0.5B-shaped model: log-probs, grad norm,
                       and the weights after one update; packed against padded log-probs and gradients (the varlen
                       kernel: flash-attn's, else torch's own `varlen_attn` through rlloom's sdpa_varlen)
  bf16_fp32_masters    both actors hold fp32 parameters and AdamW moments while the matmuls run in bf16; the share
                       of weights an lr-1e-5 step moves in fp32 against the share it would move in bf16 storage
  weight_sync          bucketed sync of the FSDP2 actor's weights (and the in-process actor's) into an `HFEngine`
                       copy in bf16: exact, timed (GB/s)
  engine_decode        `HFEngine` decode tokens/s against `transformers.generate` tokens/s, same model, same run,
                       at 64 and 256 rows
  update_3b            peak memory and update time of a Qwen2.5-3B-shaped in-process actor (fp32 masters, bf16
                       compute, gradient checkpointing), padded against packed (padding-free) micro-batches;
                       packed must cost no more than padded when it runs a varlen kernel
  mfu_update           model FLOPs utilisation of that update, padded and packed side by side (goal >= 35%)
  shared_prompt        `actor.share_prompt_forward` on the 0.5B shape in bf16, 8 samples a prompt, two layouts:
                       the update's time against the full forward's (must not be slower), the model calls each
                       update made (the shared path: 2) and the log-prob gap (bf16 rounding)
  grpo_step            one end-to-end GRPO step of `rlloom.core_rl.Trainer` with the HF engine on the actor's own
                       module (rollout, reward, advantages, packed update, weight sync) on the 0.5B shape: step time
                       by phase, and every metric finite
  retrieval_encoding   dense retrieval encoding through rlloom.retrieval's e5 path on an e5-base-v2-shaped BERT
                       (bench/gpu_checks_retrieval.py): passages/s, queries/s, wiki-18 hours, one 2,560-query turn
Models attend as a run with model.attn_implementation=auto would: flash_attention_2 where flash-attn is installed,
else sdpa_varlen (transformers' sdpa for padded rows, torch's varlen_attn for packed streams).

Models are built from `Qwen2Config` with random weights (nothing is downloaded). A global deadline (default 480 s
from start; bench/gpu_check.sh sets it from the device call's timeout) turns the checks that would not fit into SKIP
lines instead of overrunning.

Run on a GPU machine:   bash bench/gpu_check.sh   (carried wheels, no nox; docs/gpu_check.md), or
                        python bench/gpu_check.py [--out report.json]   where rlloom's dependencies are installed
Prove the code paths on a CPU:   python bench/gpu_check.py --dry-run   (= --device cpu --tiny; what a plain run does
without a GPU; about 30 s on 2 idle cores)
How to run it on a lent machine (wheels to carry, the exact command): docs/gpu_check.md.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import gc
import json
import os
import platform
import socket
import statistics
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

PYDANTIC_WHEELS = (
    "pydantic, pydantic-core, typing-inspection, annotated-types, typing-extensions, rich, markdown-it-py, mdurl, "
    "pygments"
)
MISSING_PYDANTIC = (
    "gpu_check: pydantic or rich is not importable; rlloom's packages need them. Collect the wheels here with "
    "`python scripts/gpu_wheels.py` (" + PYDANTIC_WHEELS + "), carry .whl and run bench/gpu_check.sh, which "
    "installs them for the machine's Python. See docs/gpu_check.md."
)
MISSING_RLLOOM = (
    "gpu_check: rlloom is not importable, neither installed nor from packages/*/src of this working tree; run "
    "the script from the repository (or pip install --no-deps -e packages/core-rl -e packages/rollout). "
    "See docs/gpu_check.md."
)
EXIT_MISSING_DEPENDENCY = 2

# Dense bf16 tensor-core peaks, FLOP/s. Source: NVIDIA H100 Tensor Core GPU datasheet (H100 SXM: 989 TFLOPS bf16
# dense, 1,979 with sparsity; H100 PCIe: 756 dense) and the H200 datasheet (989 dense, the same compute as H100 SXM).
BF16_DENSE_PEAK = {"H100 PCIe": 756e12, "H100": 989e12, "H200": 989e12}
MFU_GOAL = 0.35


@dataclass(frozen=True)
class Shape:
    """A Qwen2 decoder's dimensions (embeddings tied, as Qwen2.5-0.5B and -3B are)."""

    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int


QWEN25_05B = Shape("Qwen2.5-0.5B", 896, 24, 14, 2, 4864, 151_936)
QWEN25_3B = Shape("Qwen2.5-3B", 2048, 36, 16, 2, 11008, 151_936)
TINY = Shape("tiny", 64, 2, 4, 2, 128, 512)


@dataclass(frozen=True)
class Sizes:
    """Work per check: full sizes for an H100, tiny ones for a CPU dry run."""

    small: Shape
    large: Shape
    rows: int  # rows of the 0.5B actor comparison
    prompt: int
    response: int
    decode_rows: tuple[int, ...]
    decode_prompt: int
    decode_tokens: int
    decode_repeats: int
    big_rows: int  # rows of the 3B update
    big_prompt: int
    big_response: int
    big_micro_tokens: int
    big_steps: int


FULL = Sizes(QWEN25_05B, QWEN25_3B, 16, 128, 256, (64, 256), 128, 128, 2, 32, 256, 1024, 16_384, 2)
TINY_SIZES = Sizes(TINY, TINY, 4, 8, 16, (8, 16), 8, 4, 1, 8, 8, 32, 128, 1)  # decode rows cut: CPU time only

# Seconds each check may take at full size on an H100, about twice what it took on the first H100 run (2026-11-27:
# 0, 3-5, 16-19, 1, 4, 53-56, 30-35, 0 and 10-28 s, model builds included; grpo_step not yet measured: a guess of
# twice its parts, a 1 GB save, two 0.5B loads, 2 steps of 64 x 128-token rollouts); the deadline skips a check that
# would not fit. Tiny runs use a tenth. They add up to 436 s, under the default deadline.
BUDGET_S = {
    "env": 5,
    "fsdp2_api": 10,
    "nccl_vs_inprocess": 40,
    "bf16_fp32_masters": 5,
    "weight_sync": 15,
    "engine_decode": 110,
    "update_3b": 70,
    "mfu_update": 1,
    "shared_prompt": 60,
    "grpo_step": 120,
    "retrieval_encoding": 40,
}
DEFAULT_DEADLINE_S = 480.0


@dataclass
class Result:
    name: str
    status: str  # PASS, FAIL or SKIP
    seconds: float = 0.0
    figures: dict[str, Any] = field(default_factory=dict)
    note: str = ""

    def line(self) -> str:
        figures = " ".join(f"{k}={_fmt(v)}" for k, v in self.figures.items())
        return f"{self.status} {self.name} ({self.seconds:.1f}s): {figures}{' | ' + self.note if self.note else ''}"


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


class CheckFailedError(Exception):
    """A check ran but its figures miss the mark; the message says which."""


class SkipCheckError(Exception):
    """A check cannot run here (no GPU figure, a prerequisite check failed)."""


@dataclass
class Context:
    device: Any  # torch.device
    sizes: Sizes
    tiny: bool
    deadline: float  # time.monotonic() value
    shared: dict[str, Any] = field(default_factory=dict)

    @property
    def cuda(self) -> bool:
        return bool(self.device.type == "cuda")

    def sync(self) -> None:
        import torch

        if self.cuda:
            torch.cuda.synchronize()


# ---------------------------------------------------------------------------------------------------- building


def tokenizer_for(vocab: int) -> Any:
    """A word-level tokenizer with exactly `vocab` ids (4 specials + <unk> + words), so every sampled id decodes."""
    from rlloom.core_rl.tiny import word_tokenizer

    tok = word_tokenizer([f"w{i}" for i in range(vocab - 5)])
    tok.padding_side = "left"
    if len(tok) != vocab:
        raise RuntimeError(f"tokenizer has {len(tok)} ids, wanted {vocab}")
    return tok


def cached_tokenizer(ctx: Context, vocab: int) -> Any:
    """One tokenizer per vocabulary size for the whole run (a 151,936-word one takes seconds to build)."""
    key = f"tokenizer_{vocab}"
    if key not in ctx.shared:
        ctx.shared[key] = tokenizer_for(vocab)
    return ctx.shared[key]


def attention_choice(ctx: Context) -> str:
    """The attention kernel a training run with `model.attn_implementation: auto` and bf16 compute gets here
    (rlloom.core_rl.workers.attention): flash_attention_2 with flash-attn on a GPU, else sdpa."""
    from rlloom.core_rl.workers.attention import resolve_attn_implementation

    return resolve_attn_implementation("auto", ctx.device, bf16_compute=True)


def build_model(shape: Shape, tok: Any, device: Any, dtype: Any, *, seed: int = 0, attn: str = "sdpa") -> Any:
    """A randomly initialised Qwen2ForCausalLM of `shape` with attention `attn`, made directly on `device`."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=shape.vocab,
        hidden_size=shape.hidden,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        intermediate_size=shape.intermediate,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
        bos_token_id=None,
        attn_implementation=attn,
    )
    torch.manual_seed(seed)
    with torch.device(device):
        model = Qwen2ForCausalLM(config)
    model.to(dtype)
    model.generation_config.pad_token_id = tok.pad_token_id
    return model


def make_batch(vocab: int, rows: int, prompt: int, response: int, *, seed: int = 0) -> Any:
    """Rollout-like rows: prompts of 1/2 to full `prompt` length, responses of 1/8 to full `response` length (so
    padding matters), uniform advantages; ids avoid the special tokens."""
    import torch

    from rlloom.core_rl.contracts.batch import TrajectoryBatch
    from rlloom.core_rl.contracts.trajectory import Trajectory

    gen = torch.Generator().manual_seed(seed)
    trajs = []
    for i in range(rows):
        p = int(torch.randint(max(1, prompt // 2), prompt + 1, (1,), generator=gen))
        r = int(torch.randint(max(1, response // 8), response + 1, (1,), generator=gen))
        ids = torch.randint(5, vocab, (p + r,), generator=gen).tolist()
        trajs.append(Trajectory(prompt_ids=ids[:p], response_ids=ids[p:], loss_mask=[1] * r, group_id=str(i // 4)))
    batch = TrajectoryBatch.from_trajectories(trajs, pad_token_id=3)
    batch["advantages"] = torch.randn(batch.loss_mask.shape, generator=gen) * batch.loss_mask
    return batch


def grouped_batch(vocab: int, prompts: int, group: int, prompt: int, response: int, *, seed: int = 0) -> Any:
    """`prompts` prompts of 1/2 to full `prompt` length with `group` responses each of 1/8 to full `response`
    length (GRPO's layout: rows of one prompt share it token for token)."""
    import torch

    from rlloom.core_rl.contracts.batch import TrajectoryBatch
    from rlloom.core_rl.contracts.trajectory import Trajectory

    gen = torch.Generator().manual_seed(seed)
    trajs = []
    for i in range(prompts):
        p = int(torch.randint(max(1, prompt // 2), prompt + 1, (1,), generator=gen))
        prompt_ids = torch.randint(5, vocab, (p,), generator=gen).tolist()
        for _ in range(group):
            r = int(torch.randint(max(1, response // 8), response + 1, (1,), generator=gen))
            ids = torch.randint(5, vocab, (r,), generator=gen).tolist()
            trajs.append(Trajectory(prompt_ids=prompt_ids, response_ids=ids, loss_mask=[1] * r, group_id=str(i)))
    batch = TrajectoryBatch.from_trajectories(trajs, pad_token_id=3)
    batch["advantages"] = torch.randn(batch.loss_mask.shape, generator=gen) * batch.loss_mask
    return batch


def actor_kwargs(
    ctx: Context, rows: int, response: int, *, padding_free: bool, micro_tokens: int, share_prompts: bool = False
) -> dict[str, Any]:
    from rlloom.core_rl.config.schema import ActorConfig, AlgorithmConfig

    actor = ActorConfig(
        lr=1e-5,
        max_tokens_per_micro_batch=micro_tokens,
        padding_free=padding_free,
        shuffle=False,
        grad_clip=1.0,
        share_prompt_forward=share_prompts,
    )
    return {
        "actor": actor,
        "algorithm": AlgorithmConfig(),
        "total_steps": 100,
        "mini_batch_rows": rows,  # one optimizer step per update: no old log-probs needed
        "max_response_length": response,
        "device": ctx.device,
        "bf16": True,
    }


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_process_group(ctx: Context) -> None:
    """World size 1 over TCP on the loopback: NCCL on a GPU, gloo on a CPU (what `RankWorker.setup` does)."""
    import torch.distributed as dist

    if dist.is_initialized():
        return
    backend = "nccl" if ctx.cuda else "gloo"
    address = f"tcp://127.0.0.1:{free_port()}"
    # a hung collective fails after 2 minutes instead of NCCL's default 10, which would outlast the run's deadline
    dist.init_process_group(backend, init_method=address, rank=0, world_size=1, timeout=timedelta(seconds=120))


def release_memory() -> None:
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# ---------------------------------------------------------------------------------------------------- checks


def check_env(ctx: Context) -> dict[str, Any]:
    import torch
    import transformers

    figures: dict[str, Any] = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "transformers": transformers.__version__,
        "device": str(ctx.device),
    }
    if ctx.cuda:
        name = torch.cuda.get_device_name(ctx.device)
        figures["gpu"] = name
        figures["gpu_memory_gib"] = round(torch.cuda.get_device_properties(ctx.device).total_memory / 2**30, 1)
        figures["nccl"] = ".".join(str(v) for v in torch.cuda.nccl.version())
        figures["bf16_dense_peak_tflops"] = (peak_flops(name) or 0) / 1e12 or None
    return figures


def peak_flops(device_name: str) -> float | None:
    """The bf16 dense peak of a known GPU, None for anything else (no MFU claimed then)."""
    for key, value in BF16_DENSE_PEAK.items():  # "H100 PCIe" is tried before "H100"
        if all(part in device_name for part in key.split()):
            return value
    return None


FSDP2_CALLS = [
    ("torch.distributed.fsdp", "fully_shard"),
    ("torch.distributed.fsdp", "MixedPrecisionPolicy"),
    ("torch.distributed.fsdp", "FSDPModule.set_gradient_divide_factor"),
    ("torch.distributed.fsdp", "FSDPModule.set_force_sum_reduction_for_comms"),
    ("torch.distributed.fsdp", "FSDPModule.reshard"),
    ("torch.distributed.checkpoint.state_dict", "get_model_state_dict"),
    ("torch.distributed.checkpoint.state_dict", "StateDictOptions"),
    ("torch.distributed.tensor", "DTensor.full_tensor"),
    ("torch.distributed.tensor", "DTensor.to_local"),
    ("torch.distributed.tensor", "distribute_tensor"),
]


def check_fsdp2_api(ctx: Context) -> dict[str, Any]:
    import importlib

    missing = []
    for module_name, attr in FSDP2_CALLS:
        try:
            obj: Any = importlib.import_module(module_name)
            for part in attr.split("."):
                obj = getattr(obj, part)
        except (ImportError, AttributeError):
            missing.append(f"{module_name}.{attr}")
    if missing:
        raise CheckFailedError(f"missing on this torch: {', '.join(missing)}")
    from torch.distributed.fsdp import FSDPModule

    # only models with a vision tower need it (shard_model refuses those without it); a record, not a pass mark
    unused_params = hasattr(FSDPModule, "set_reduce_scatter_unused_params")
    return {"calls_found": len(FSDP2_CALLS), "reduce_scatter_unused_params_for_vlm": unused_params}


def check_nccl_vs_inprocess(ctx: Context) -> dict[str, Any]:
    import torch

    from rlloom.core_rl.contracts.batch import scatter_rows
    from rlloom.core_rl.distributed.fsdp import shard_model
    from rlloom.core_rl.distributed.ranks import RankContext, ShardedPolicyActor
    from rlloom.core_rl.workers.actor import PolicyActor
    from rlloom.core_rl.workers.precision import Precision, fsdp_mixed_precision

    s = ctx.sizes
    start_process_group(ctx)
    tok = cached_tokenizer(ctx, s.small.vocab)
    base = build_model(s.small, tok, ctx.device, torch.float32, attn=attention_choice(ctx))
    copy_model = copy.deepcopy(base)
    initial = {k: v.detach().clone() for k, v in base.state_dict().items()}
    budget = s.rows * (s.prompt + s.response)  # one micro-batch: the same forward on both sides
    kwargs = actor_kwargs(ctx, s.rows, s.response, padding_free=False, micro_tokens=budget)
    inproc = PolicyActor(base, **kwargs)
    precision = Precision(params=torch.float32, compute=torch.bfloat16)
    sharded_model = shard_model(copy_model, fsdp_mixed_precision(precision))
    sharded = ShardedPolicyActor(sharded_model, RankContext(0, 1, ctx.device), **kwargs)
    batch = make_batch(s.small.vocab, s.rows, s.prompt, s.response, seed=1)
    mask = batch.loss_mask.bool()

    lp_a, _ = inproc.compute_logprobs(batch, temperature=1.0)
    rows_b, lp_b_rows, _ = sharded.rank_logprobs(batch, temperature=1.0)
    lp_b = scatter_rows([(rows_b, lp_b_rows)], batch.batch_size, batch.response_width)
    diff = (lp_a - lp_b).abs()[mask]
    packed_diff, packed_grad_cosine = packed_vs_padded(inproc.model, batch, ctx)
    ctx.sync()
    t0 = time.perf_counter()
    m_a = inproc.update_policy(batch)
    ctx.sync()
    t1 = time.perf_counter()
    m_b = sharded.update_policy(batch)
    ctx.sync()
    t2 = time.perf_counter()

    after_b = sharded.named_weights()  # full state at rank 0, on CPU
    dot = norm_a = norm_b = 0.0
    worst_rel = 0.0
    for name, w_a in inproc.model.state_dict().items():
        delta_a = (w_a.detach().float() - initial[name].float()).flatten()
        delta_b = (after_b[name].to(ctx.device).float() - initial[name].float()).flatten()
        dot += float(delta_a @ delta_b)
        norm_a += float(delta_a @ delta_a)
        norm_b += float(delta_b @ delta_b)
        scale = float(delta_a.abs().max())
        if scale > 0:
            worst_rel = max(worst_rel, float((delta_a - delta_b).abs().max()) / scale)
    cosine = dot / max((norm_a * norm_b) ** 0.5, 1e-30)
    figures = {
        "model": s.small.name,
        "attention": str(inproc.model.config._attn_implementation),
        "params_M": round(sum(p.numel() for p in inproc.model.parameters()) / 1e6, 1),
        "tokens": int(batch["attention_mask"].sum()),
        "logprob_mean": float(lp_a[mask].mean()),
        "logprob_absdiff_mean": float(diff.mean()),
        "logprob_absdiff_max": float(diff.max()),
        "packed_attention": packed_attention(inproc.model, ctx),
        "packed_vs_padded_logprob_absdiff_mean": float(packed_diff.mean()),
        "packed_vs_padded_logprob_absdiff_max": float(packed_diff.max()),
        "packed_vs_padded_grad_cosine": packed_grad_cosine,
        "grad_norm_inproc": m_a["actor/grad_norm"],
        "grad_norm_fsdp": m_b["actor/grad_norm"],
        "grad_norm_ratio_fsdp_over_inproc": m_b["actor/grad_norm"] / max(m_a["actor/grad_norm"], 1e-30),
        "update_delta_cosine": cosine,
        "update_delta_maxdiff_over_maxdelta": worst_rel,
        "update_s_inproc": t1 - t0,
        "update_s_fsdp": t2 - t1,
    }
    ctx.shared.update(tok=tok, inproc=inproc, sharded=sharded, initial=initial, batch=batch)
    problems = []
    if not diff.mean() <= 1e-2 or not diff.max() <= 0.1:
        problems.append("log-probs differ beyond bf16 rounding (mean <= 0.01, max <= 0.1)")
    if not packed_diff.mean() <= 1e-2 or not packed_diff.max() <= 0.1:
        problems.append(f"packed log-probs ({figures['packed_attention']}) differ from padded beyond bf16 rounding")
    if not packed_grad_cosine >= 0.99:
        problems.append(f"packed gradients ({figures['packed_attention']}) differ from padded (cosine < 0.99)")
    if not abs(figures["grad_norm_ratio_fsdp_over_inproc"] - 1) <= 0.05:
        problems.append("grad norms differ by more than 5%")
    if not cosine >= 0.9:
        problems.append("update directions differ (cosine < 0.9)")
    if problems:
        raise CheckFailedError("; ".join(problems), figures)
    return figures


def packed_attention(model: Any, ctx: Context) -> str:
    """How a packed stream attends with this model's kernel here (rlloom.core_rl.workers.attention)."""
    from rlloom.core_rl.workers.attention import packed_attention_backend

    return packed_attention_backend(model, ctx.device, bf16_compute=True)


def packed_vs_padded(model: Any, batch: Any, ctx: Context) -> tuple[Any, float]:
    """(|packed - padded| response log-probs at the response tokens, cosine of the two gradients of the
    advantage-weighted log-probs), bf16 compute: the packed forward and backward run the varlen kernel."""
    import torch

    from rlloom.core_rl.workers.forward import response_logprobs
    from rlloom.core_rl.workers.precision import compute_autocast

    on_device = batch.to(ctx.device)
    logprobs, grads = [], []
    for packed in (False, True):
        model.zero_grad(set_to_none=True)
        with compute_autocast(ctx.device, True):
            lp, _ = response_logprobs(model, on_device, packed=packed)
        (lp.float() * on_device["advantages"]).sum().backward()
        logprobs.append(lp.detach())
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]))
    model.zero_grad(set_to_none=True)
    cosine = float(torch.nn.functional.cosine_similarity(grads[0], grads[1], dim=0))
    del grads
    return (logprobs[1] - logprobs[0]).abs()[on_device.loss_mask.bool()].float().cpu(), cosine


def check_bf16_fp32_masters(ctx: Context) -> dict[str, Any]:
    import torch

    if "inproc" not in ctx.shared:
        raise SkipCheckError("needs nccl_vs_inprocess, which did not finish")
    inproc, sharded, initial, batch = (ctx.shared[k] for k in ("inproc", "sharded", "initial", "batch"))

    def local(t: torch.Tensor) -> torch.Tensor:
        return t.to_local() if hasattr(t, "to_local") else t

    figures: dict[str, Any] = {}
    for label, actor in (("inproc", inproc), ("fsdp", sharded)):
        param_dtypes = {str(local(p).dtype) for p in actor.model.parameters()}
        moment_dtypes = {
            str(local(v).dtype) for st in actor.optimizer.state.values() for k, v in st.items() if k != "step"
        }
        seen: list[str] = []
        layer = actor.model.model.layers[0].mlp.down_proj
        handle = layer.register_forward_hook(lambda _m, _i, out, seen=seen: seen.append(str(out.dtype)))
        try:
            actor.compute_logprobs(batch.select([0]), temperature=1.0)
        finally:
            handle.remove()
        figures[f"{label}_param_dtypes"] = ",".join(sorted(param_dtypes))
        figures[f"{label}_adam_moment_dtypes"] = ",".join(sorted(moment_dtypes))
        figures[f"{label}_matmul_out_dtype"] = ",".join(sorted(set(seen)))
    moved_fp32 = moved_bf16 = total = 0
    for name, w in inproc.model.state_dict().items():
        before = initial[name].float()
        after = w.detach().float()
        moved_fp32 += int((after != before).sum())
        # what the same step would leave in bf16 storage: the bf16 weight plus the same delta, rounded to bf16
        stored = before.bfloat16()
        moved_bf16 += int(((stored.float() + (after - before)).bfloat16() != stored).sum())
        total += before.numel()
    figures["share_moved_fp32_masters"] = moved_fp32 / total
    figures["share_moved_if_bf16_storage"] = moved_bf16 / total
    expected = {"param_dtypes": "torch.float32", "adam_moment_dtypes": "torch.float32", "matmul_out_dtype": ""}
    wrong = [
        f"{label}_{key}={figures[f'{label}_{key}']}"
        for label in ("inproc", "fsdp")
        for key, want in expected.items()
        if (figures[f"{label}_{key}"] != want if want else figures[f"{label}_{key}"] != "torch.bfloat16")
    ]
    if wrong:
        raise CheckFailedError("want fp32 parameters and moments, bf16 matmuls: " + ", ".join(wrong), figures)
    return figures


def check_weight_sync(ctx: Context) -> dict[str, Any]:
    import torch

    from rlloom.core_rl.workers.weight_sync import sync_weights
    from rlloom.rollout.hf.engine import HFEngine, HFEngineConfig

    if "sharded" not in ctx.shared:
        raise SkipCheckError("needs nccl_vs_inprocess, which did not finish")
    sharded, inproc, tok = ctx.shared["sharded"], ctx.shared["inproc"], ctx.shared["tok"]
    engine_model = build_model(ctx.sizes.small, tok, ctx.device, torch.bfloat16, seed=7).eval()
    engine = HFEngine(engine_model, tok, HFEngineConfig(max_batch_rows=max(ctx.sizes.decode_rows)))
    bucket_bytes = 256 << 20
    nbytes = sum(v.numel() * v.element_size() for v in engine_model.state_dict().values())

    ctx.sync()
    t0 = time.perf_counter()
    buckets = sharded.weight_bucket_plan(bucket_bytes)
    for names in buckets:
        engine.update_weights(sharded.gather_weights(names))
    ctx.sync()
    fsdp_s = time.perf_counter() - t0
    full = sharded.named_weights()
    fsdp_err = max(
        float((v.float() - full[k].to(ctx.device).to(torch.bfloat16).float()).abs().max())
        for k, v in engine_model.state_dict().items()
    )
    ctx.sync()
    t0 = time.perf_counter()
    calls = sync_weights(inproc, engine, bucket_bytes=bucket_bytes)
    ctx.sync()
    inproc_s = time.perf_counter() - t0
    inproc_state = inproc.model.state_dict()
    inproc_err = max(
        float((v.float() - inproc_state[k].to(torch.bfloat16).float()).abs().max())
        for k, v in engine_model.state_dict().items()
    )
    ctx.shared["engine"] = engine
    figures = {
        "engine_weights_GB_bf16": nbytes / 1e9,
        "fsdp_buckets": len(buckets),
        "fsdp_sync_s": fsdp_s,
        "fsdp_sync_GB_per_s": nbytes / 1e9 / fsdp_s,
        "fsdp_max_abs_err_vs_bf16_of_actor": fsdp_err,
        "inproc_update_weights_calls": calls,
        "inproc_sync_s": inproc_s,
        "inproc_sync_GB_per_s": nbytes / 1e9 / inproc_s,
        "inproc_max_abs_err_vs_bf16_of_actor": inproc_err,
    }
    if fsdp_err != 0.0 or inproc_err != 0.0:
        raise CheckFailedError("engine weights are not the actor's weights rounded to bf16", figures)
    return figures


def check_engine_decode(ctx: Context) -> dict[str, Any]:
    import torch

    from rlloom.core_rl.contracts.generation import GenerationRequest, SamplingParams

    if "engine" not in ctx.shared:
        raise SkipCheckError("needs weight_sync, which did not finish")
    # the actors are done with: free their memory for the decode batches and the 3B update
    for key in ("inproc", "sharded", "initial"):
        ctx.shared.pop(key, None)
    release_memory()
    engine, tok, s = ctx.shared["engine"], ctx.shared["tok"], ctx.sizes
    model = engine.model
    gen = torch.Generator().manual_seed(3)

    def run_generate(prompts: list[list[int]]) -> float:
        padded = tok.pad({"input_ids": prompts}, return_tensors="pt").to(ctx.device)
        ctx.sync()
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(
                **padded,
                do_sample=True,
                temperature=1.0,
                top_p=1.0,
                top_k=0,
                max_new_tokens=s.decode_tokens,
                min_new_tokens=s.decode_tokens,
                pad_token_id=tok.pad_token_id,
            )
        ctx.sync()
        return (out.shape[1] - padded["input_ids"].shape[1]) * out.shape[0] / (time.perf_counter() - t0)

    def run_engine(prompts: list[list[int]]) -> float:
        params = SamplingParams(temperature=1.0, max_tokens=s.decode_tokens, ignore_eos=True)
        requests = [GenerationRequest(prompt_ids=p, sampling=params) for p in prompts]
        ctx.sync()
        t0 = time.perf_counter()
        out = engine.generate(requests)
        ctx.sync()
        return sum(len(c[0].token_ids) for c in out) / (time.perf_counter() - t0)

    figures: dict[str, Any] = {"model": s.small.name, "prompt_tokens": s.decode_prompt, "new_tokens": s.decode_tokens}
    slow = []
    for rows in s.decode_rows:
        lengths = [max(4, s.decode_prompt - (i % 4) * (s.decode_prompt // 8)) for i in range(rows)]
        prompts = [torch.randint(5, s.small.vocab, (n,), generator=gen).tolist() for n in lengths]
        run_generate(prompts)  # warm-up both paths (allocator, kernels)
        run_engine(prompts)
        g: list[float] = []
        e: list[float] = []
        for r in range(s.decode_repeats):
            for which in (0, 1) if r % 2 == 0 else (1, 0):
                (g if which == 0 else e).append(run_generate(prompts) if which == 0 else run_engine(prompts))
        g_med, e_med = statistics.median(g), statistics.median(e)
        figures[f"rows{rows}_generate_tok_s"] = g_med
        figures[f"rows{rows}_engine_tok_s"] = e_med
        figures[f"rows{rows}_engine_over_generate"] = e_med / g_med
        if e_med < 0.9 * g_med:
            slow.append(rows)
    engine.close()
    ctx.shared.pop("engine", None)
    release_memory()
    if slow and not ctx.tiny:
        raise CheckFailedError(f"engine below 0.9x transformers.generate at {slow} rows", figures)
    return figures


def check_update_3b(ctx: Context) -> dict[str, Any]:
    import torch

    from rlloom.core_rl.workers.actor import PolicyActor

    for key in list(ctx.shared):
        if not key.startswith("tokenizer_"):
            ctx.shared.pop(key)
    release_memory()
    s = ctx.sizes
    tok = cached_tokenizer(ctx, s.large.vocab)
    model = build_model(s.large, tok, ctx.device, torch.float32, seed=11, attn=attention_choice(ctx))
    model.config.use_cache = False
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    batch = make_batch(s.large.vocab, s.big_rows, s.big_prompt, s.big_response, seed=5)
    real = int(batch["attention_mask"].sum())
    lengths = batch["attention_mask"].sum(-1).tolist()
    figures: dict[str, Any] = {
        "model": s.large.name,
        "params_M": round(sum(p.numel() for p in model.parameters()) / 1e6, 1),
        "rows": s.big_rows,
        "real_tokens": real,
        "padded_tokens": int(batch["attention_mask"].numel()),
        "micro_batch_token_budget": s.big_micro_tokens,
        "packed_attention": packed_attention(model, ctx),
    }
    modes: dict[str, float] = {}
    for mode, packed in (("padded", False), ("packed", True)):
        kwargs = actor_kwargs(ctx, s.big_rows, s.big_response, padding_free=packed, micro_tokens=s.big_micro_tokens)
        actor = PolicyActor(model, **kwargs)
        try:
            actor.update_policy(batch)  # warm-up: allocates AdamW state and the kernels' workspaces
            ctx.sync()
            held = actor.state_bytes()  # parameters and AdamW moments kept between steps
            figures[f"{mode}_params_and_adam_GiB"] = (held["parameters"] + held["optimizer"]) / 2**30
            if ctx.cuda:
                torch.cuda.reset_peak_memory_stats(ctx.device)
            times = []
            for _ in range(s.big_steps):
                t0 = time.perf_counter()
                actor.update_policy(batch)
                ctx.sync()
                times.append(time.perf_counter() - t0)
            modes[mode] = statistics.median(times)
            figures[f"{mode}_update_s"] = modes[mode]
            if ctx.cuda:
                figures[f"{mode}_peak_GiB"] = torch.cuda.max_memory_allocated(ctx.device) / 2**30
        except torch.cuda.OutOfMemoryError as err:
            figures[f"{mode}_error"] = f"out of memory: {str(err).splitlines()[0][:160]}"
        finally:
            actor.optimizer.zero_grad(set_to_none=True)
            del actor
            release_memory()
    ctx.shared["update"] = {
        "seconds": modes,
        "params": sum(p.numel() for p in model.parameters()),
        "real_tokens": real,
        "sum_sq_lengths": sum(int(n) ** 2 for n in lengths),
        "layers": s.large.layers,
        "hidden": s.large.hidden,
        "packed_attention": figures["packed_attention"],
    }
    del model
    release_memory()
    if len(modes) < 2:
        raise CheckFailedError("a mode did not finish", figures)
    figures["packed_over_padded_time"] = modes["packed"] / modes["padded"]
    if ctx.cuda:
        figures["packed_over_padded_peak"] = figures["packed_peak_GiB"] / figures["padded_peak_GiB"]
        costlier = figures["packed_over_padded_peak"] > 1.05 or figures["packed_over_padded_time"] > 1.05
        if costlier and "dense" not in figures["packed_attention"]:
            raise CheckFailedError("packed micro-batches should cost no more than padded ones", figures)
        if costlier:  # plain sdpa / eager: transformers attends over a dense [nnz, nnz] mask, nnz^2 work
            figures["packed_note"] = "costlier than padded: a dense [nnz, nnz] mask, no varlen path"
    return figures


def check_shared_prompt(ctx: Context) -> dict[str, Any]:
    """`actor.share_prompt_forward` on the 0.5B shape in bf16, 8 samples a prompt: each prompt forwarded once
    against every row's full forward, the same update otherwise (one PPO step, padded, one micro-batch). Two
    layouts: prompts as long as responses, and long prompts with short responses (retrieved passages, few-shot).
    The model's calls per update are counted, so the figures show which path each mode took."""
    import torch

    release_memory()
    s = ctx.sizes
    tok = cached_tokenizer(ctx, s.small.vocab)
    model = build_model(s.small, tok, ctx.device, torch.float32, seed=13, attn=attention_choice(ctx))
    layouts = {
        "even": (max(1, s.rows // 2), 2 * s.prompt, s.response),
        "long_prompt": (2, 8 * s.prompt, s.response // 2),
    }
    figures: dict[str, Any] = {"model": s.small.name}
    try:
        for label, (prompts, p_len, r_len) in layouts.items():
            batch = grouped_batch(s.small.vocab, prompts, 8, p_len, r_len, seed=9)
            part = _shared_prompt_layout(ctx, model, batch, r_len)
            figures.update({f"{label}_{key}": value for key, value in part.items()})
    finally:
        del model
        release_memory()
    if max(figures[f"{label}_max_abs_logprob_gap_bf16"] for label in layouts) > 0.1:
        raise CheckFailedError("shared-prompt log-probs differ from the full forward's beyond bf16 rounding", figures)
    if any(figures[f"{label}_model_calls_shared"] != 2 for label in layouts):
        raise CheckFailedError("the shared mode did not take the shared path (2 model calls a micro-batch)", figures)
    if ctx.cuda and min(figures[f"{label}_update_full_over_shared"] for label in layouts) < 1.0:
        raise CheckFailedError("the shared-prompt update is slower than the full forward's", figures)
    return figures


def _shared_prompt_layout(ctx: Context, model: Any, batch: Any, response: int) -> dict[str, Any]:
    """One layout of `check_shared_prompt`: log-prob gap, forward-only and update medians of both modes."""
    import torch

    from rlloom.core_rl.workers.actor import PolicyActor
    from rlloom.core_rl.workers.forward import response_logprobs
    from rlloom.core_rl.workers.precision import compute_autocast

    rows = batch.batch_size
    on_device = batch.to(ctx.device)
    calls: list[tuple[int, ...]] = []
    hook = model.register_forward_pre_hook(
        lambda _m, _a, kw: calls.append(tuple(kw["input_ids"].shape)), with_kwargs=True
    )
    prompt_tokens = float(batch["attention_mask"][:, : batch.prompt_width].sum())
    response_tokens = float(batch.response_attention_mask.sum())
    figures: dict[str, Any] = {
        "rows": f"{rows // 8} prompts x 8",
        "prompt_width": batch.prompt_width,
        "response_width": batch.response_width,
        "token_ratio": (prompt_tokens + response_tokens) / (prompt_tokens / 8 + response_tokens),
    }
    modes = ("full", "shared")
    try:
        forward_s: dict[str, list[float]] = {mode: [] for mode in modes}
        with torch.no_grad(), compute_autocast(ctx.device, True):
            lp = {mode: response_logprobs(model, on_device, share_prompts=mode == "shared")[0] for mode in modes}
            for _ in range(3):
                for mode in modes:
                    ctx.sync()
                    t0 = time.perf_counter()
                    response_logprobs(model, on_device, share_prompts=mode == "shared")
                    ctx.sync()
                    forward_s[mode].append(time.perf_counter() - t0)
        mask = on_device.response_attention_mask.bool()
        figures["max_abs_logprob_gap_bf16"] = float((lp["full"] - lp["shared"])[mask].abs().max())
        update_s: dict[str, list[float]] = {mode: [] for mode in modes}
        actors = {
            mode: PolicyActor(
                model,
                **actor_kwargs(
                    ctx, rows, response, padding_free=False, micro_tokens=10**9, share_prompts=mode == "shared"
                ),
            )
            for mode in modes
        }
        for actor in actors.values():
            actor.update_policy(batch)  # warm-up
        for _ in range(max(2, ctx.sizes.big_steps)):
            for mode, actor in actors.items():
                ctx.sync()
                calls.clear()
                t0 = time.perf_counter()
                actor.update_policy(batch)
                ctx.sync()
                update_s[mode].append(time.perf_counter() - t0)
                figures[f"model_calls_{mode}"] = len(calls)
                figures[f"model_call_shapes_{mode}"] = " ".join("x".join(map(str, shape)) for shape in calls)
        del actors
    finally:
        hook.remove()
    for kind, series in (("forward", forward_s), ("update", update_s)):
        for mode in modes:
            figures[f"{kind}_s_{mode}"] = statistics.median(series[mode])
        figures[f"{kind}_full_over_shared"] = figures[f"{kind}_s_full"] / figures[f"{kind}_s_shared"]
    return figures


def check_mfu_update(ctx: Context) -> dict[str, Any]:
    import torch

    up = ctx.shared.get("update")
    if not up or "packed" not in up["seconds"]:
        raise SkipCheckError("needs update_3b's packed timing, which did not finish")
    # FLOPs of one update: 6 x params x real tokens (forward 2, backward 4; gradient checkpointing's recompute is
    # not counted: this is MFU, not hardware FLOPs utilisation) plus causal attention, 6 x layers x hidden x
    # sum(T_i^2) over rows (PaLM's 12 L H Q T per token, halved for the causal mask).
    flops = 6 * up["params"] * up["real_tokens"] + 6 * up["layers"] * up["hidden"] * up["sum_sq_lengths"]
    figures: dict[str, Any] = {
        "update_TFLOPs": flops / 1e12,
        "flops_formula": "6*N*T + 6*L*d*sum(T_i^2): N params, T real tokens, L layers, d hidden, T_i row lengths",
        "packed_attention": up.get("packed_attention", ""),
    }
    for mode, seconds in up["seconds"].items():
        figures[f"{mode}_achieved_TFLOP_s"] = flops / seconds / 1e12
    peak = peak_flops(torch.cuda.get_device_name(ctx.device)) if ctx.cuda else None
    if peak is None:
        raise SkipCheckError("no bf16 dense peak known for this device: achieved TFLOP/s only", figures)
    figures["peak_TFLOP_s"] = peak / 1e12
    for mode, seconds in up["seconds"].items():
        figures[f"{mode}_mfu"] = flops / seconds / peak
    figures["goal_mfu"] = MFU_GOAL
    if figures["packed_mfu"] < MFU_GOAL:
        raise CheckFailedError(f"packed MFU {figures['packed_mfu']:.1%} below the {MFU_GOAL:.0%} goal", figures)
    return figures


def even_word_reward(trajectories: Any) -> list[Any]:
    """GRPO needs rewards that differ within a group, and a random model writes random words: the share of the
    response's words with an even index (`w0`, `w2`, ...), about 0.5 with row-to-row spread."""
    from rlloom.core_rl.contracts.protocols import RewardOutput

    outputs = []
    for traj in trajectories:
        words = [w for w in traj.response_text.split() if w[1:].isdigit()]
        even = sum(int(w[1:]) % 2 == 0 for w in words) / len(words) if words else 0.0
        outputs.append(RewardOutput(score=even, components={"even_share": even}))
    return outputs


def grpo_config(ctx: Context, folder: Path, prompts: int, group: int, max_tokens: int) -> Any:
    """A GRPO run on the saved model in `folder`: bf16 compute over fp32 masters, packed micro-batches (the varlen
    path), one optimizer step per update, no reference model (kl off), no checkpoint (steps are driven here)."""
    from rlloom.core_rl.config.schema import RLConfig

    return RLConfig.model_validate(
        {
            "model": {"path": str(folder / "model"), "tokenizer_path": str(folder / "tokenizer"), "dtype": "bfloat16"},
            "data": {"train_batch_size": prompts},
            "rollout": {"engine": "hf", "n": group, "max_tokens": max_tokens, "temperature": 1.0},
            "algorithm": {"advantage": {"estimator": "grpo"}},
            "actor": {
                "lr": 1e-6,
                "mini_batch_size": prompts,
                "padding_free": True,
                "max_tokens_per_micro_batch": 16_384 if not ctx.tiny else 256,
            },
            "trainer": {
                "total_steps": 2,
                "output_dir": str(folder / "run"),
                "device": "cuda" if ctx.cuda else "cpu",
                "trackers": ["jsonl"],
                "seed": 0,
            },
        }
    )


def check_grpo_step(ctx: Context) -> dict[str, Any]:
    """One end-to-end GRPO step of `rlloom.core_rl.Trainer` with rollout.engine=hf (an `HFEngine` on the actor's own
    module, built by the engine factory the trainer calls) on a randomly initialised model saved to a temporary
    folder: a warm-up step, then the timed one. Passes when every metric is finite and the update moved
    the policy (a non-zero grad norm)."""
    import math
    import tempfile

    import torch

    from rlloom.core_rl.trainer import Trainer
    from rlloom.rollout.hf.engine import HFEngine, HFEngineConfig

    for key in list(ctx.shared):
        if not key.startswith("tokenizer_"):
            ctx.shared.pop(key)
    release_memory()
    s = ctx.sizes
    prompts, group, max_tokens = (8, 8, 128) if not ctx.tiny else (2, 4, 8)
    tok = cached_tokenizer(ctx, s.small.vocab)
    rows = [
        {
            "prompt": [{"role": "user", "content": " ".join(f"w{(7 * i + j) % 1000}" for j in range(16 + 4 * i))}],
            "data_source": "gpu_check",
            "reward_model": {"ground_truth": ""},
        }
        for i in range(2 * prompts)
    ]
    with tempfile.TemporaryDirectory(prefix="gpu_check_grpo_") as tmp:
        folder = Path(tmp)
        t0 = time.perf_counter()
        model = build_model(s.small, tok, ctx.device, torch.bfloat16, seed=17)
        model.save_pretrained(folder / "model")
        tok.save_pretrained(folder / "tokenizer")
        del model
        release_memory()
        config = grpo_config(ctx, folder, prompts, group, max_tokens)
        engines: list[Any] = []

        def engine_on(module: Any) -> Any:
            engines.append(HFEngine(module, tok, HFEngineConfig(max_batch_rows=prompts * group)))
            return engines[-1]

        try:
            trainer = Trainer(config, reward_fn=even_word_reward, train_data=rows, engine=engine_on)
            setup_s = time.perf_counter() - t0
            actor_model = trainer.parts.actor.model
            trainer.weights.sync()
            steps = []
            for _ in range(2):
                trainer.step += 1
                ctx.sync()
                t1 = time.perf_counter()
                metrics = trainer.train_step()
                ctx.sync()
                steps.append((time.perf_counter() - t1, metrics))
            attn = packed_attention(actor_model, ctx)
            del trainer, actor_model
        finally:
            for engine in engines:
                engine.close()
            release_memory()
    step_s, metrics = steps[-1]
    timing = {k.removeprefix("timing/"): v for k, v in metrics.items() if k.startswith("timing/")}
    figures: dict[str, Any] = {
        "model": s.small.name,
        "rows": f"{prompts} prompts x {group}",
        "max_tokens": max_tokens,
        "packed_attention": attn,
        "setup_s": setup_s,
        "warmup_step_s": steps[0][0],
        "step_s": step_s,
        **{f"phase_{k}": v for k, v in sorted(timing.items())},
        "tokens_per_s": metrics.get("perf/tokens_per_s"),
        "reward_mean": metrics.get("reward/mean", metrics.get("critic/score/mean")),
        "grad_norm": metrics.get("actor/grad_norm"),
        "metrics": len(metrics),
    }
    bad = sorted(k for k, v in metrics.items() if isinstance(v, float) and not math.isfinite(v))
    if bad:
        figures["non_finite"] = ",".join(bad[:10])
        raise CheckFailedError(f"{len(bad)} metrics are not finite", figures)
    if not metrics.get("actor/grad_norm", 0.0) > 0:
        raise CheckFailedError("the update did not run (actor/grad_norm missing or 0)", figures)
    return figures


def check_retrieval_encoding(ctx: Context) -> dict[str, Any]:
    """e5-base-v2-shaped dense encoding through rlloom.retrieval's path: bench/gpu_checks_retrieval.py."""
    bench = str(Path(__file__).resolve().parent)
    if bench not in sys.path:  # run as a file (python bench/gpu_check.py, runpy): its folder holds the module
        sys.path.insert(0, bench)
    import gpu_checks_retrieval as retrieval

    missing = retrieval.missing_modules()
    if missing:
        figures = {"missing": ",".join(missing), "python": platform.python_version()}
        raise SkipCheckError(retrieval.missing_note(missing), figures)
    figures = retrieval.measure(ctx)
    sizes = retrieval.TINY_ENCODING if ctx.tiny else retrieval.FULL_ENCODING
    found = retrieval.problems(figures, sizes.hidden)
    if found:
        raise CheckFailedError("; ".join(found), figures)
    return figures


CHECKS: list[tuple[str, Callable[[Context], dict[str, Any]]]] = [
    ("env", check_env),
    ("fsdp2_api", check_fsdp2_api),
    ("nccl_vs_inprocess", check_nccl_vs_inprocess),
    ("bf16_fp32_masters", check_bf16_fp32_masters),
    ("weight_sync", check_weight_sync),
    ("engine_decode", check_engine_decode),
    ("update_3b", check_update_3b),
    ("mfu_update", check_mfu_update),
    ("shared_prompt", check_shared_prompt),
    ("grpo_step", check_grpo_step),
    ("retrieval_encoding", check_retrieval_encoding),
]


# ---------------------------------------------------------------------------------------------------- running


def run_check(ctx: Context, name: str, fn: Callable[[Context], dict[str, Any]]) -> Result:
    budget = BUDGET_S[name] / (10 if ctx.tiny else 1)
    left = ctx.deadline - time.monotonic()
    if left < budget:
        return Result(name, "SKIP", note=f"deadline: {left:.0f}s left, the check is budgeted {budget:.0f}s")
    t0 = time.perf_counter()
    try:
        figures = fn(ctx)
        return Result(name, "PASS", time.perf_counter() - t0, figures)
    except SkipCheckError as err:
        extra = err.args[1] if len(err.args) > 1 else {}
        return Result(name, "SKIP", time.perf_counter() - t0, extra, note=str(err.args[0]))
    except CheckFailedError as err:
        extra = err.args[1] if len(err.args) > 1 else {}
        return Result(name, "FAIL", time.perf_counter() - t0, extra, note=str(err.args[0]))
    except Exception as err:  # a crash in one check must not stop the others
        tb = traceback.format_exc(limit=6).strip().splitlines()
        return Result(name, "FAIL", time.perf_counter() - t0, {"traceback": tb[-6:]}, note=repr(err)[:300])


REPO = Path(__file__).resolve().parents[1]
SOURCE_DIRS = [REPO / "packages" / "core-rl" / "src", REPO / "packages" / "rollout" / "src"]


def import_rlloom() -> None:
    """Import rlloom's core-rl and rollout packages; when they are not installed, from this working tree's sources
    (`rlloom` is a namespace package, so the two src folders on sys.path are enough: nothing to build or fetch)."""
    import importlib

    try:
        for module in ("rlloom.core_rl", "rlloom.rollout"):
            importlib.import_module(module)
    except ImportError:
        if not all(folder.is_dir() for folder in SOURCE_DIRS):
            raise
        sys.path[:0] = [str(folder) for folder in SOURCE_DIRS]
        for name in [m for m in sys.modules if m == "rlloom" or m.startswith("rlloom.")]:
            del sys.modules[name]
        for module in ("rlloom.core_rl", "rlloom.rollout"):
            importlib.import_module(module)


def default_out() -> Path:
    folder = os.environ.get("OUT")
    return Path(folder) / "gpu_check.json" if folder else Path("gpu_check.json")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--device", default="auto", help="auto (cuda when present, else the CPU dry run), cuda, or cpu (full shapes)"
    )
    parser.add_argument("--tiny", action="store_true", help="tiny shapes (code paths only; figures meaningless)")
    parser.add_argument("--dry-run", action="store_true", help="the same as --device cpu --tiny")
    parser.add_argument("--out", type=Path, default=None, help="JSON report path (default $OUT/gpu_check.json)")
    parser.add_argument(
        "--deadline-s",
        type=float,
        default=DEFAULT_DEADLINE_S,
        help="skip checks that would end past this many seconds from the start",
    )
    parser.add_argument("--only", default="", help="comma-separated check names (default: all)")
    args = parser.parse_args(argv)
    if args.dry_run:
        args.device, args.tiny = "cpu", True
    return args


def write_report(path: Path, results: list[Result], meta: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    counts = {s: sum(r.status == s for r in results) for s in ("PASS", "FAIL", "SKIP")}
    report = {**meta, "counts": counts, "checks": [asdict(r) for r in results]}
    path.write_text(json.dumps(report, indent=2, default=str) + "\n")


@contextlib.contextmanager
def _process_group_torn_down() -> Iterator[None]:
    try:
        yield
    finally:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    started = time.monotonic()
    args = parse_args(argv)
    out = args.out or default_out()
    try:
        import torch
        import transformers  # noqa: F401
    except ImportError as err:
        print(f"gpu_check: {err}; run it with the Python that has torch and transformers", flush=True)
        write_report(out, [Result("env", "FAIL", note=str(err))], {"error": str(err)})
        return EXIT_MISSING_DEPENDENCY
    try:
        import pydantic  # noqa: F401  # rlloom's configs are pydantic models
        import rich  # noqa: F401  # the trainer's console tracker (grpo_step)
    except ImportError:
        print(MISSING_PYDANTIC, flush=True)
        write_report(out, [Result("env", "FAIL", note=MISSING_PYDANTIC)], {"error": "pydantic missing"})
        return EXIT_MISSING_DEPENDENCY
    try:
        import_rlloom()
    except ImportError as err:
        print(f"{MISSING_RLLOOM} ({err})", flush=True)
        write_report(out, [Result("env", "FAIL", note=MISSING_RLLOOM)], {"error": str(err)})
        return EXIT_MISSING_DEPENDENCY
    import torch

    if args.device == "auto" and not torch.cuda.is_available():
        # full shapes on a CPU would take hours: without a GPU, auto means the dry run (`nox -s bench` runs this)
        print("gpu_check: torch sees no GPU; running the CPU dry run (tiny shapes, code paths only)", flush=True)
        args.device, args.tiny = "cpu", True
    if args.device == "auto":
        args.device = "cuda"
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_check: --device cuda but torch sees no GPU; use --dry-run on a CPU", flush=True)
        return EXIT_MISSING_DEPENDENCY
    device = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    ctx = Context(device, TINY_SIZES if args.tiny else FULL, args.tiny, started + args.deadline_s)
    wanted = {n.strip() for n in args.only.split(",") if n.strip()}
    unknown = wanted - {name for name, _ in CHECKS}
    if unknown:
        print(f"gpu_check: --only names unknown checks {sorted(unknown)}; known: {[n for n, _ in CHECKS]}")
        return EXIT_MISSING_DEPENDENCY
    import rlloom.core_rl

    meta = {
        "argv": sys.argv[1:] if argv is None else argv,
        "device": str(device),
        "tiny": args.tiny,
        "rlloom_core_rl_from": str(Path(rlloom.core_rl.__file__).parent),
    }
    results: list[Result] = []
    with _process_group_torn_down():
        for name, fn in CHECKS:
            if wanted and name not in wanted:
                continue
            result = run_check(ctx, name, fn)
            results.append(result)
            print(result.line(), flush=True)
            write_report(out, results, {**meta, "elapsed_s": time.monotonic() - started})
    elapsed = time.monotonic() - started
    write_report(out, results, {**meta, "elapsed_s": elapsed})
    counts = {s: sum(r.status == s for r in results) for s in ("PASS", "FAIL", "SKIP")}
    print(f"gpu_check: {counts['PASS']} passed, {counts['FAIL']} failed, {counts['SKIP']} skipped in {elapsed:.0f}s")
    print(f"gpu_check: report {out}")
    return 1 if counts["FAIL"] else 0


if __name__ == "__main__":
    sys.exit(main())
