"""Rows that share a prompt forward it once (`actor.share_prompt_forward`): the log-probs, entropies and gradients
must equal the full padded forward's, which runs every row's prompt again. The model's own forward calls are
recorded, so the tests also see which path ran and how many prompt rows it forwarded."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch

from rlloom.core_rl.contracts.batch import TrajectoryBatch
from rlloom.core_rl.contracts.trajectory import Trajectory
from rlloom.core_rl.tiny import char_tokenizer, tiny_qwen2
from rlloom.core_rl.workers.forward import response_logprobs, shared_prompt_rows


@pytest.fixture(scope="module")
def model() -> Any:
    torch.manual_seed(0)
    return tiny_qwen2(char_tokenizer(), seed=3, num_layers=2).eval()


def trajectory(prompt: list[int], response: list[int]) -> Trajectory:
    return Trajectory(prompt_ids=prompt, response_ids=response, loss_mask=[1] * len(response))


def grouped_batch() -> TrajectoryBatch:
    """Two prompts of different lengths (so one is left-padded) with three and two samples of different lengths,
    interleaved, plus one prompt of its own."""
    gen = torch.Generator().manual_seed(1)

    def ids(n: int) -> list[int]:
        return torch.randint(10, 60, (n,), generator=gen).tolist()

    long_prompt, short_prompt, single = ids(9), ids(5), ids(7)
    rows = [
        (long_prompt, ids(6)),
        (short_prompt, ids(3)),
        (long_prompt, ids(8)),
        (single, ids(4)),
        (short_prompt, ids(8)),
        (long_prompt, ids(1)),
    ]
    return TrajectoryBatch.from_trajectories([trajectory(p, r) for p, r in rows], pad_token_id=0)


@pytest.fixture
def forward_calls(model: Any) -> Iterator[list[tuple[int, ...]]]:
    """The input_ids shape of every forward of `model` while the test runs."""
    calls: list[tuple[int, ...]] = []
    handle = model.register_forward_pre_hook(
        lambda _m, _args, kwargs: calls.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True
    )
    yield calls
    handle.remove()


def test_rows_sharing_a_prompt_are_found_with_their_padding() -> None:
    batch = grouped_batch()
    groups = shared_prompt_rows(batch)
    assert groups is not None
    first, inverse = groups
    # rows 0, 2, 5 share the long prompt, rows 1, 4 the short one, row 3 is alone
    assert first[inverse].tolist() == [0, 1, 0, 3, 1, 0]
    assert sorted(first.tolist()) == [0, 1, 3]
    distinct = TrajectoryBatch.from_trajectories(
        [trajectory([11, 12], [13]), trajectory([11, 14], [13]), trajectory([12], [13])], pad_token_id=0
    )
    assert shared_prompt_rows(distinct) is None


def test_shared_forward_equals_the_full_forward(model: Any, forward_calls: list[tuple[int, ...]]) -> None:
    batch = grouped_batch()
    full_lp, full_ent = response_logprobs(model, batch, temperature=0.7, entropy=True)
    assert forward_calls == [(6, batch.prompt_width + batch.response_width)]
    forward_calls.clear()
    lp, ent = response_logprobs(model, batch, temperature=0.7, entropy=True, share_prompts=True)
    # one forward of the three distinct prompts, one of the six responses over their cached keys and values
    assert forward_calls == [(3, batch.prompt_width), (6, batch.response_width)]
    mask = batch.response_attention_mask.bool()
    assert full_ent is not None and ent is not None
    torch.testing.assert_close(lp, full_lp, rtol=0, atol=2e-5)
    torch.testing.assert_close(ent, full_ent, rtol=0, atol=2e-5)
    assert bool((lp[~mask] == 0).all())  # padding stays 0 as in the full forward
    assert bool((full_lp[mask] < 0).all())  # real log-probs, so the comparison is not between zeros


def test_shared_forward_gives_the_full_forwards_gradients(model: Any) -> None:
    batch = grouped_batch()
    weights = torch.linspace(-1.0, 1.0, batch.response_width).expand(batch.batch_size, -1)

    def gradients(share: bool) -> dict[str, torch.Tensor]:
        model.zero_grad(set_to_none=True)
        lp, _ = response_logprobs(model, batch, share_prompts=share)
        (lp * weights * batch.response_attention_mask).sum().backward()
        return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}

    full, shared = gradients(False), gradients(True)
    assert full.keys() == shared.keys() and len(full) == len(list(model.parameters()))
    for name, grad in full.items():
        torch.testing.assert_close(shared[name], grad, rtol=1e-4, atol=1e-6, msg=name)
    # the prompt-only path carries gradient: an embedding row used only by prompt tokens moved
    prompt_only = set(batch["input_ids"][:, : batch.prompt_width].flatten().tolist()) - set(
        batch["input_ids"][:, batch.prompt_width :].flatten().tolist()
    )
    embed = shared["model.embed_tokens.weight"]
    assert any(float(embed[token].abs().sum()) > 0 for token in prompt_only)


def test_activation_checkpointing_and_distinct_prompts_take_the_full_forward(
    model: Any, forward_calls: list[tuple[int, ...]]
) -> None:
    batch = grouped_batch()
    expected, _ = response_logprobs(model, batch)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    try:
        forward_calls.clear()
        lp, _ = response_logprobs(model, batch, share_prompts=True)
    finally:
        model.gradient_checkpointing_disable()
    assert forward_calls == [(6, batch.prompt_width + batch.response_width)]
    torch.testing.assert_close(lp, expected, rtol=0, atol=1e-6)
    distinct = batch.select([0, 1, 3])
    forward_calls.clear()
    response_logprobs(model, distinct, share_prompts=True)
    assert len(forward_calls) == 1
