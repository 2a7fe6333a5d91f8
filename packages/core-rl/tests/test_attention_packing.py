"""The attention kernel is chosen explicitly, and a packed stream reaches flash-attention's varlen path without a
dense mask, while plain sdpa (chosen explicitly; auto without flash-attn is sdpa_varlen, see
test_packed_attention_varlen.py) builds the dense block-diagonal mask transformers 5 makes for packed position ids
(logged).

flash-attn needs a GPU, so its varlen kernel is stood in for by a reference that runs causal SDPA on each sequence
cut out by the boundaries it is handed: the model runs transformers' real flash-attention dispatch (mask
function, kwargs plumbing through every layer) and the reference fails if the boundaries do not arrive. Log-probs
of the packed forward must equal the padded forward's, which attends through a padding mask instead.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import torch
from test_workers import random_batch
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from rlloom.core_rl.config.schema import ConfigError, ModelConfig
from rlloom.core_rl.contracts.packing import pack
from rlloom.core_rl.workers import attention
from rlloom.core_rl.workers.actor import load_causal_lm
from rlloom.core_rl.workers.critic import ValueModel
from rlloom.core_rl.workers.forward import response_hidden_states, response_logprobs

CPU = torch.device("cpu")
CUDA = torch.device("cuda")


def test_auto_picks_flash_attention_only_where_it_can_run(monkeypatch: pytest.MonkeyPatch) -> None:
    resolve = attention.resolve_attn_implementation
    monkeypatch.setattr(attention, "flash_attn_installed", lambda: True)
    assert resolve("auto", CUDA, bf16_compute=True) == "flash_attention_2"
    assert resolve("auto", CUDA, bf16_compute=False) == "sdpa_varlen"  # the kernel has no fp32 path
    assert resolve("auto", CPU, bf16_compute=True) == "sdpa_varlen"
    monkeypatch.setattr(attention, "flash_attn_installed", lambda: False)
    assert resolve("auto", CUDA, bf16_compute=True) == "sdpa_varlen"  # torch's own varlen path, no flash-attn
    assert resolve("sdpa", CUDA, bf16_compute=True) == "sdpa"
    assert resolve("eager", CUDA, bf16_compute=True) == "eager"
    with pytest.raises(ConfigError, match=r"flash_attention_2 needs the flash-attn package .* and a CUDA device"):
        resolve("flash_attention_2", CPU, bf16_compute=True)
    monkeypatch.setattr(attention, "flash_attn_installed", lambda: True)
    with pytest.raises(ConfigError, match=r"bf16 compute \(set model.dtype=bfloat16"):
        resolve("flash_attention_2", CUDA, bf16_compute=False)
    with pytest.raises(ValueError, match="attn_implementation"):
        ModelConfig(path="m", attn_implementation="flash_attention_3")  # type: ignore[arg-type]


def test_models_load_with_the_resolved_kernel(tiny_model_dir: Path) -> None:
    cfg = ModelConfig(path=str(tiny_model_dir))
    assert cfg.attn_implementation == "auto"
    assert load_causal_lm(cfg, str(tiny_model_dir), CPU).config._attn_implementation == "sdpa_varlen"
    eager = cfg.model_copy(update={"attn_implementation": "eager"})
    assert ValueModel.from_pretrained(eager, str(tiny_model_dir), CPU).backbone.config._attn_implementation == "eager"
    with pytest.raises(ConfigError, match="flash_attention_2 needs"):
        load_causal_lm(cfg.model_copy(update={"attn_implementation": "flash_attention_2"}), str(tiny_model_dir), CPU)


def varlen_reference(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """flash-attention's varlen contract on the CPU: causal attention inside each [cu[i], cu[i+1]) span only."""
    assert attention_mask is None, "flash-attention's mask function must not build a mask for a packed stream"
    cu = kwargs["cu_seq_lens_q"]  # KeyError: the boundaries did not reach the kernel
    assert cu is kwargs["cu_seq_lens_k"] and cu.dtype == torch.int32
    assert kwargs["max_length_q"] == int((cu[1:] - cu[:-1]).max())
    CALLS.append(cu.tolist())
    parts = []
    for start, end in zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True):
        q, k, v = (t[:, :, start:end] for t in (query, key, value))
        parts.append(
            torch.nn.functional.scaled_dot_product_attention(
                q, k, v, is_causal=True, scale=kwargs.get("scaling"), enable_gqa=True
            )
        )
    return torch.cat(parts, dim=2).transpose(1, 2).contiguous(), None


CALLS: list[list[int]] = []


@pytest.fixture
def fake_flash(monkeypatch: pytest.MonkeyPatch) -> list[list[int]]:
    """Route transformers' flash_attention_2 dispatch to `varlen_reference`; returns the boundaries each call got."""
    CALLS.clear()
    monkeypatch.setitem(ALL_ATTENTION_FUNCTIONS, "flash_attention_2", varlen_reference)
    return CALLS


def record_masks(monkeypatch: pytest.MonkeyPatch, name: str) -> list[Any]:
    built: list[Any] = []
    real = ALL_MASK_ATTENTION_FUNCTIONS[name]

    def recording(*args: Any, **kwargs: Any) -> Any:
        mask = real(*args, **kwargs)
        built.append(mask)
        return mask

    monkeypatch.setitem(ALL_MASK_ATTENTION_FUNCTIONS, name, recording)
    return built


def test_packed_stream_reaches_the_varlen_kernel_without_a_mask(
    tiny_model_dir: Path, fake_flash: list[list[int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    model = load_causal_lm(ModelConfig(path=str(tiny_model_dir)), str(tiny_model_dir), CPU).eval()
    batch = random_batch(model.config.vocab_size)
    with torch.no_grad():
        padded, _ = response_logprobs(model, batch, temperature=0.7, packed=False)  # sdpa with a padding mask
        model.config._attn_implementation = "flash_attention_2"
        masks = record_masks(monkeypatch, "flash_attention_2")
        packed, _ = response_logprobs(model, batch, temperature=0.7, packed=True)
    boundaries = pack(batch["input_ids"], batch["attention_mask"]).cu_seqlens.tolist()
    assert fake_flash == [boundaries] * model.config.num_hidden_layers  # every layer got them, no re-derivation
    assert masks and all(mask is None for mask in masks)
    torch.testing.assert_close(packed, padded, rtol=1e-5, atol=1e-5)


def test_critic_packed_stream_reaches_the_varlen_kernel(tiny_model_dir: Path, fake_flash: list[list[int]]) -> None:
    critic = ValueModel.from_pretrained(ModelConfig(path=str(tiny_model_dir)), str(tiny_model_dir), CPU).eval()
    batch = random_batch(critic.backbone.config.vocab_size)
    with torch.no_grad():
        padded = response_hidden_states(critic.backbone, batch, packed=False)
        critic.backbone.config._attn_implementation = "flash_attention_2"
        packed = response_hidden_states(critic.backbone, batch, packed=True)
    assert len(fake_flash) == critic.backbone.config.num_hidden_layers
    mask = batch.response_attention_mask.bool()
    torch.testing.assert_close(packed[mask], padded[mask], rtol=1e-5, atol=1e-5)


def test_sdpa_packing_builds_the_dense_block_mask_and_logs_its_size_once(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = ModelConfig(path=str(tiny_model_dir), attn_implementation="sdpa")  # chosen explicitly (auto: sdpa_varlen)
    model = load_causal_lm(cfg, str(tiny_model_dir), CPU).eval()
    batch = random_batch(model.config.vocab_size)
    nnz = int(batch["attention_mask"].sum())
    monkeypatch.setattr(attention, "_LOGGED_DENSE_MASK", set())
    with torch.no_grad():
        padded, _ = response_logprobs(model, batch, temperature=0.7, packed=False)
        masks = record_masks(monkeypatch, "sdpa")
        with caplog.at_level(logging.WARNING, logger=attention.__name__):
            packed, _ = response_logprobs(model, batch, temperature=0.7, packed=True)
            response_logprobs(model, batch, temperature=0.7, packed=True)
    assert [tuple(mask.shape) for mask in masks] == [(1, 1, nnz, nnz)] * 2  # once per forward, shared by layers
    lengths = batch["attention_mask"].sum(-1)
    # block-diagonal and causal: row i sees its own sequence's earlier tokens only
    assert int(masks[0].sum()) == int((lengths * (lengths + 1) // 2).sum())
    logged = [r.getMessage() for r in caplog.records if "dense block-diagonal" in r.getMessage()]
    assert len(logged) == 1 and f"[{nnz}, {nnz}]" in logged[0]
    assert f"{attention.dense_mask_bytes('sdpa', nnz) / 2**20:.3g} MiB" in logged[0]
    torch.testing.assert_close(packed, padded, rtol=1e-5, atol=1e-5)
