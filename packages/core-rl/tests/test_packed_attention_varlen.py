"""`sdpa_varlen`: packed (padding-free) forwards attend within each sequence with no `[nnz, nnz]` mask, padded
forwards are transformers' sdpa unchanged.

Expectations are independent of the code under test: the padded forward (a padding mask through transformers'
sdpa), a dense block-diagonal causal mask built here by hand, and the size of every tensor the forward and
backward create (a `TorchDispatchMode` sees each op's outputs). torch's `varlen_attn` needs a CUDA device; its
signature adaptation is checked against a reference with an older torch's signature, and its numbers on the GPU
by bench/gpu_check.py (packed against padded log-probs).
"""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path
from typing import Any

import pytest
import torch
from test_workers import random_batch
from torch.utils._python_dispatch import TorchDispatchMode
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

from rlloom.core_rl.config.schema import ModelConfig
from rlloom.core_rl.contracts.batch import TrajectoryBatch
from rlloom.core_rl.contracts.trajectory import Trajectory
from rlloom.core_rl.tiny import char_tokenizer, tiny_qwen2
from rlloom.core_rl.workers import attention
from rlloom.core_rl.workers.actor import load_causal_lm
from rlloom.core_rl.workers.forward import response_logprobs

CPU = torch.device("cpu")


def ragged_batch(vocab: int, lengths: list[tuple[int, int]], seed: int = 0) -> TrajectoryBatch:
    gen = torch.Generator().manual_seed(seed)
    trajs = []
    for i, (p, r) in enumerate(lengths):
        ids = torch.randint(10, vocab, (p + r,), generator=gen).tolist()
        trajs.append(Trajectory(prompt_ids=ids[:p], response_ids=ids[p:], loss_mask=[1] * r, group_id=str(i)))
    batch = TrajectoryBatch.from_trajectories(trajs, pad_token_id=3)
    batch["advantages"] = torch.randn(batch.loss_mask.shape, generator=gen) * batch.loss_mask
    return batch


def test_auto_on_a_cpu_loads_sdpa_varlen(tiny_model_dir: Path) -> None:
    model = load_causal_lm(ModelConfig(path=str(tiny_model_dir)), str(tiny_model_dir), CPU)
    assert model.config._attn_implementation == attention.VARLEN
    assert attention.uses_varlen_kernel(model)
    assert attention.packed_attention_backend(model, CPU, bf16_compute=True) == "sdpa_varlen: causal sdpa per sequence"


def test_packed_logprobs_and_gradients_equal_the_padded_forwards(monkeypatch: pytest.MonkeyPatch) -> None:
    model = tiny_qwen2(char_tokenizer(), num_layers=2)
    model.set_attn_implementation(attention.VARLEN)
    batch = random_batch(model.config.vocab_size)  # ragged prompts and responses, left/right padding
    built: list[Any] = []
    real = ALL_MASK_ATTENTION_FUNCTIONS[attention.VARLEN]

    def recording(*args: Any, **kwargs: Any) -> Any:
        built.append(real(*args, **kwargs))
        return built[-1]

    monkeypatch.setitem(ALL_MASK_ATTENTION_FUNCTIONS, attention.VARLEN, recording)
    grads = {}
    results = {}
    for packed in (False, True):
        model.zero_grad()
        built.clear()
        lp, ent = response_logprobs(model, batch, temperature=0.7, packed=packed, entropy=True)
        (lp * batch["advantages"]).sum().backward()
        grads[packed] = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
        results[packed] = (lp.detach(), ent.detach() if ent is not None else None, list(built))
    (pad_lp, pad_ent, pad_masks), (pk_lp, pk_ent, pk_masks) = results[False], results[True]
    assert pad_masks and all(m is not None and m.ndim == 4 for m in pad_masks)  # padding needs sdpa's mask
    assert pk_masks == [None]  # one mask call per forward, and it built nothing for the packed stream
    torch.testing.assert_close(pk_lp, pad_lp, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(pk_ent, pad_ent, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grads[True], grads[False], rtol=1e-4, atol=1e-5)


def test_padded_forward_is_transformers_sdpa_exactly() -> None:
    model = tiny_qwen2(char_tokenizer())
    batch = random_batch(model.config.vocab_size, seed=3)
    with torch.no_grad():
        model.set_attn_implementation("sdpa")
        plain, _ = response_logprobs(model, batch, packed=False)
        model.set_attn_implementation(attention.VARLEN)
        ours, _ = response_logprobs(model, batch, packed=False)
    assert torch.equal(ours, plain)


def block_causal_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths: list[int]) -> torch.Tensor:
    """Dense reference: one SDPA over the whole stream with a hand-built block-diagonal causal mask."""
    seq = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
    pos = torch.arange(seq.numel())
    mask = (seq[:, None] == seq[None, :]) & (pos[:, None] >= pos[None, :])
    out = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), attn_mask=mask, enable_gqa=True
    )
    return out.transpose(0, 1)


def test_per_sequence_attention_equals_a_block_diagonal_causal_mask() -> None:
    gen = torch.Generator().manual_seed(0)
    lengths = [5, 1, 17, 3, 9]
    nnz = sum(lengths)
    q, k, v = (torch.randn(nnz, h, 8, generator=gen) for h in (6, 2, 2))
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    got = attention.varlen_causal_attention(q, k, v, cu, max(lengths))
    torch.testing.assert_close(got, block_causal_reference(q, k, v, lengths), rtol=1e-5, atol=1e-6)


class LargestTensor(TorchDispatchMode):
    """Records the element count of the largest tensor any op creates (forward and backward)."""

    def __init__(self) -> None:
        super().__init__()
        self.numel = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.numel = max(self.numel, t.numel())
        return out


def largest_tensor(model: torch.nn.Module, batch: TrajectoryBatch) -> int:
    model.zero_grad()
    with LargestTensor() as seen:
        lp, _ = response_logprobs(model, batch, packed=True)
        (lp * batch["advantages"]).sum().backward()
    return seen.numel


def test_a_long_packed_stream_never_creates_an_nnz_squared_tensor() -> None:
    model = tiny_qwen2(char_tokenizer(), num_layers=1)
    lengths = [(16 + 7 * i, 40 + 23 * i) for i in range(12)]  # 56 .. 373 tokens a row
    batch = ragged_batch(model.config.vocab_size, lengths)
    nnz = int(batch["attention_mask"].sum())
    longest = max(p + r for p, r in lengths)
    model.set_attn_implementation(attention.VARLEN)
    ours = largest_tensor(model, batch)
    # the largest tensor is per token (logits, hidden states) or one sequence's scores, never the stream's square
    vocab, heads, hidden = model.config.vocab_size, model.config.num_attention_heads, model.config.intermediate_size
    assert ours <= max(nnz * max(vocab, hidden), heads * longest * longest)
    assert ours < nnz * nnz // 8
    model.set_attn_implementation("sdpa")  # the dense path this replaces builds the [1, 1, nnz, nnz] mask
    assert largest_tensor(model, batch) >= nnz * nnz


def reference_varlen_attn_2_9(  # noqa: PLR0917 - torch's own signature
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cu_seq_q: torch.Tensor,
    cu_seq_k: torch.Tensor,
    max_q: int,
    max_k: int,
    is_causal: bool = False,
    return_aux: Any = None,
) -> torch.Tensor:
    """torch 2.9's `varlen_attn` signature (no window_size, scale or enable_gqa; heads must match), computed by
    the dense reference: stands in for the CUDA kernel to check how `torch_varlen_call` adapts to it."""
    assert is_causal and key.shape[1] == query.shape[1] and cu_seq_q is cu_seq_k and max_q == max_k
    lengths = (cu_seq_q[1:] - cu_seq_q[:-1]).tolist()
    assert max_q == max(lengths)
    return block_causal_reference(query, key, value, lengths)


def test_torch_varlen_call_adapts_to_an_older_signature(monkeypatch: pytest.MonkeyPatch) -> None:
    module = importlib.import_module("torch.nn.attention.varlen")
    attention.torch_varlen_call.cache_clear()
    monkeypatch.setattr(module, "varlen_attn", reference_varlen_attn_2_9)
    try:
        assert attention.torch_varlen_call(4, 2, 0.5) is None  # a non-default scale it cannot take: fall back
        call = attention.torch_varlen_call(4, 2, None)
        assert call is not None
        gen = torch.Generator().manual_seed(1)
        lengths = [3, 8, 2]
        q, k, v = (torch.randn(13, h, 8, generator=gen) for h in (4, 2, 2))
        cu = torch.tensor([0, 3, 11, 13], dtype=torch.int32)
        got = call(q, k, v, cu, 8)  # key/value heads repeated for a torch without enable_gqa
        torch.testing.assert_close(got, block_causal_reference(q, k, v, lengths), rtol=1e-5, atol=1e-6)
    finally:
        attention.torch_varlen_call.cache_clear()


def test_this_torch_offers_varlen_attn_with_causal_windows_and_gqa() -> None:
    """What the GPU path calls on torch 2.13 (the CPU venv); the GPU check records the lent machine's torch."""
    from torch.nn.attention.varlen import varlen_attn

    params = inspect.signature(varlen_attn).parameters
    assert {"window_size", "scale", "enable_gqa"} <= set(params)
    assert attention.torch_varlen_call(14, 2, 0.125) is not None
