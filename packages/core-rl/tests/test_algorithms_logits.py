"""Chunked token log-probs and entropy against numpy, torch's log_softmax/Categorical, and their gradients."""

from __future__ import annotations

import algorithms_numpy_reference as ref  # tests/ is on sys.path (conftest)
import numpy as np
import pytest
import torch

from rlloom.core_rl.algorithms import entropy_from_logits, logprobs_from_logits


def _batch(seed: int = 0, shape: tuple[int, int] = (3, 5), vocab: int = 11) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(*shape, vocab, generator=gen) * 3
    ids = torch.randint(0, vocab, shape, generator=gen)
    return logits, ids


@pytest.mark.parametrize("chunk_size", [1, 4, 1024])
def test_logprobs_match_numpy_and_log_softmax(chunk_size: int) -> None:
    logits, ids = _batch()
    got = logprobs_from_logits(logits, ids, chunk_size=chunk_size)
    expected = np.array(
        [[ref.log_softmax_row(logits[b, t].tolist())[int(ids[b, t])] for t in range(5)] for b in range(3)]
    )
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got, torch.log_softmax(logits, -1).gather(-1, ids[..., None]).squeeze(-1))


def test_logprobs_gradient_equals_log_softmax_gradient() -> None:
    logits, ids = _batch(1)
    a = logits.clone().requires_grad_(True)
    b = logits.clone().requires_grad_(True)
    logprobs_from_logits(a, ids, chunk_size=2).sum().backward()
    torch.log_softmax(b, -1).gather(-1, ids[..., None]).sum().backward()
    assert a.grad is not None and b.grad is not None
    torch.testing.assert_close(a.grad, b.grad)


def test_logprobs_backward_passes_gradcheck_with_weighted_rows_and_a_ragged_last_chunk() -> None:
    """The hand-written backward (softmax - one-hot, chunk by chunk) against finite differences in float64,
    with upstream gradients that differ per row (a loss weights tokens unequally) and 7 rows in chunks of 3."""
    gen = torch.Generator().manual_seed(11)
    logits = torch.randn(7, 5, dtype=torch.float64, generator=gen).requires_grad_(True)
    ids = torch.randint(0, 5, (7,), generator=gen)
    weights = torch.randn(7, dtype=torch.float64, generator=gen)
    assert torch.autograd.gradcheck(lambda x: logprobs_from_logits(x, ids, chunk_size=3) * weights, (logits,))


def test_logprobs_gradient_reaches_a_non_contiguous_slice_of_logits() -> None:
    """The forward slices logits as `out.logits[:, -keep:-1]` (not contiguous); the gradient lands on the slice."""
    gen = torch.Generator().manual_seed(12)
    full = torch.randn(2, 6, 9, generator=gen)
    ids = torch.randint(0, 9, (2, 3), generator=gen)
    weights = torch.rand(2, 3, generator=gen)
    a = full.clone().requires_grad_(True)
    b = full.clone().requires_grad_(True)
    (logprobs_from_logits(a[:, -4:-1], ids, chunk_size=4) * weights).sum().backward()
    (torch.log_softmax(b[:, -4:-1], -1).gather(-1, ids[..., None]).squeeze(-1) * weights).sum().backward()
    assert a.grad is not None and b.grad is not None
    torch.testing.assert_close(a.grad, b.grad)
    assert bool((a.grad[:, :2] == 0).all()) and bool((a.grad[:, -1] == 0).all())


def test_bf16_logits_are_upcast_per_chunk() -> None:
    logits, ids = _batch(2)
    got = logprobs_from_logits(logits.bfloat16(), ids, chunk_size=4)
    assert got.dtype == torch.float32
    expected = torch.log_softmax(logits.bfloat16().float(), -1).gather(-1, ids[..., None]).squeeze(-1)
    torch.testing.assert_close(got, expected)


def test_bf16_gradient_with_recomputation_equals_the_direct_gradient() -> None:
    logits, ids = _batch(5)
    a = logits.bfloat16().requires_grad_(True)
    b = logits.bfloat16().requires_grad_(True)
    logprobs_from_logits(a, ids, chunk_size=4).sum().backward()
    torch.log_softmax(b.float(), -1).gather(-1, ids[..., None]).sum().backward()
    assert a.grad is not None and b.grad is not None
    torch.testing.assert_close(a.grad, b.grad)


def test_logprobs_input_errors() -> None:
    logits, ids = _batch()
    with pytest.raises(ValueError, match="must lie in \\[0, 11\\)"):
        logprobs_from_logits(logits, ids + 11)
    with pytest.raises(ValueError, match="share leading dims"):
        logprobs_from_logits(logits, ids[:, :2])
    with pytest.raises(ValueError, match="chunk_size must be"):
        logprobs_from_logits(logits, ids, chunk_size=0)


@pytest.mark.parametrize("chunk_size", [1, 4, 1024])
def test_entropy_matches_numpy_and_categorical(chunk_size: int) -> None:
    logits, _ = _batch(3)
    got = entropy_from_logits(logits, chunk_size=chunk_size)
    expected = np.array([[ref.entropy_row(logits[b, t].tolist()) for t in range(5)] for b in range(3)])
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got, torch.distributions.Categorical(logits=logits).entropy())


def test_entropy_gradient_with_recomputation_equals_direct_gradient() -> None:
    logits, _ = _batch(4)
    logits = logits.double()
    a = logits.clone().requires_grad_(True)
    b = logits.clone().requires_grad_(True)
    (entropy_from_logits(a, chunk_size=3) * torch.arange(15.0, dtype=torch.float64).reshape(3, 5)).sum().backward()
    (
        torch.distributions.Categorical(logits=b).entropy() * torch.arange(15.0, dtype=torch.float64).reshape(3, 5)
    ).sum().backward()
    assert a.grad is not None and b.grad is not None
    torch.testing.assert_close(a.grad, b.grad)


def test_uniform_logits_have_entropy_log_v() -> None:
    got = entropy_from_logits(torch.zeros(2, 7))
    torch.testing.assert_close(got, torch.full((2,), float(np.log(7))))
