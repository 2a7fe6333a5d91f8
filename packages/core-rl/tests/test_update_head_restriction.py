"""The policy update runs the LM head only on the hidden states that score a loss-mask-1 token
(`response_logprobs(..., scored=)`, `actor.restrict_lm_head`). Checked against the full head, which computes
every response position's logits: the wanted tokens' log-probs, entropies and the gradients of a masked loss must
be the same on every forward path (padded, packed, shared prompt), the unwanted ones 0, and the head must have
seen only as many positions as there are wanted tokens."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from rlloom.core_rl.config.schema import ActorConfig, AlgorithmConfig, ModelConfig
from rlloom.core_rl.contracts.batch import TrajectoryBatch
from rlloom.core_rl.contracts.trajectory import Trajectory
from rlloom.core_rl.tiny import char_tokenizer, tiny_qwen2
from rlloom.core_rl.workers.actor import PolicyActor, load_causal_lm
from rlloom.core_rl.workers.forward import response_logprobs

CPU = torch.device("cpu")


def agent_batch(vocab: int = 60) -> TrajectoryBatch:
    """Conversations as an agent loop records them: groups sharing a prompt, responses whose middle (an
    observation) has loss mask 0, one row whose first response token is an observation's (mask 0 at column 0),
    and one row with nothing trained."""
    gen = torch.Generator().manual_seed(4)

    def ids(n: int) -> list[int]:
        return torch.randint(10, vocab, (n,), generator=gen).tolist()

    long_prompt, short_prompt = ids(9), ids(5)
    rows = [
        (long_prompt, [1, 1, 0, 0, 0, 1, 1]),
        (short_prompt, [1, 0, 0, 1]),
        (long_prompt, [1, 1, 1, 0, 0, 0, 0, 1]),
        (short_prompt, [0, 0, 1, 1, 1]),  # starts with an observation
        (long_prompt, [1, 1]),
        (ids(6), [0, 0, 0]),  # nothing trained
    ]
    trajectories = [Trajectory(prompt_ids=p, response_ids=ids(len(m)), loss_mask=m) for p, m in rows]
    batch = TrajectoryBatch.from_trajectories(trajectories, pad_token_id=0)
    batch["advantages"] = torch.randn(batch.loss_mask.shape, generator=gen) * batch.loss_mask
    return batch


@pytest.fixture
def head_rows(request: pytest.FixtureRequest) -> Iterator[tuple[nn.Module, list[tuple[int, ...]]]]:
    """A tiny model and the shape of every logits tensor its LM head produced while the test ran."""
    torch.manual_seed(0)
    model = tiny_qwen2(char_tokenizer(), seed=5, num_layers=2).eval()
    shapes: list[tuple[int, ...]] = []
    handle = model.get_output_embeddings().register_forward_hook(lambda _m, _a, out: shapes.append(tuple(out.shape)))
    yield model, shapes
    handle.remove()


PATHS = [  # (packed, share_prompts)
    pytest.param(False, False, id="padded"),
    pytest.param(True, False, id="packed"),
    pytest.param(False, True, id="shared-prompt"),
]


@pytest.mark.parametrize(("packed", "share"), PATHS)
def test_scored_tokens_match_the_full_head_and_the_rest_are_zero(
    head_rows: tuple[nn.Module, list[tuple[int, ...]]], packed: bool, share: bool
) -> None:
    model, shapes = head_rows
    batch = agent_batch()
    wanted = batch.loss_mask != 0
    with torch.no_grad():
        full_lp, full_ent = response_logprobs(model, batch, temperature=0.7, packed=packed, entropy=True)
        shapes.clear()
        lp, ent = response_logprobs(
            model, batch, temperature=0.7, packed=packed, entropy=True, share_prompts=share, scored=wanted
        )
    assert full_ent is not None and ent is not None
    torch.testing.assert_close(lp[wanted], full_lp[wanted], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ent[wanted], full_ent[wanted], rtol=1e-5, atol=1e-6)
    assert not lp[~wanted].any() and not ent[~wanted].any()
    vocab = model.config.vocab_size
    n_wanted = int(wanted.sum())  # 4 + 2 + 4 + 3 + 2 + 0 = 15 of 34 response tokens
    assert n_wanted == 15
    if share:
        # the prompt forward keeps one logit row per distinct prompt (3); the response forward's head sees the
        # wanted tokens after column 0 (rows 0, 1, 2, 4 want their token 0, so 15 - 4 = 11)
        assert shapes == [(3, 1, vocab), (1, 11, vocab)]
    else:
        assert shapes == [(1, n_wanted, vocab)]


@pytest.mark.parametrize(("packed", "share"), PATHS)
def test_masked_loss_gradients_match_the_full_head(packed: bool, share: bool) -> None:
    """A policy-gradient-like loss over the loss-mask tokens, with an entropy term: the same gradient on every
    parameter, the tied embedding (the LM head's weight) included."""
    batch = agent_batch()
    wanted = batch.loss_mask != 0

    def grads(scored: torch.Tensor | None) -> dict[str, torch.Tensor]:
        torch.manual_seed(0)
        model = tiny_qwen2(char_tokenizer(), seed=6, num_layers=2).train()
        lp, ent = response_logprobs(
            model, batch, temperature=0.9, packed=packed, entropy=True, share_prompts=share, scored=scored
        )
        assert ent is not None
        mask = batch.loss_mask.float()
        loss = -(lp * batch["advantages"] * mask).sum() / mask.sum() - 0.01 * (ent * mask).sum() / mask.sum()
        loss.backward()  # type: ignore[no-untyped-call]
        return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}

    full, restricted = grads(None), grads(wanted)
    assert full.keys() == restricted.keys() and full
    for name, grad in full.items():
        torch.testing.assert_close(restricted[name], grad, rtol=1e-4, atol=1e-7, msg=name)


class HeadlessWrapper(nn.Module):
    """A model that exposes no output-embeddings module (a custom wrapper): the head cannot be hooked."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, **kwargs: Any) -> Any:
        return self.inner(**kwargs)


def test_a_model_without_a_head_module_takes_the_full_logits_and_masks_them() -> None:
    model = tiny_qwen2(char_tokenizer(), seed=7, num_layers=2).eval()
    batch = agent_batch()
    wanted = batch.loss_mask != 0
    with torch.no_grad():
        full, _ = response_logprobs(model, batch)
        lp, _ = response_logprobs(HeadlessWrapper(model), batch, scored=wanted)
    torch.testing.assert_close(lp, torch.where(wanted, full, torch.zeros_like(full)), rtol=1e-5, atol=1e-6)


def policy_actor(model_dir: Path, *, restrict: bool) -> PolicyActor:
    model = load_causal_lm(ModelConfig(path=str(model_dir)), str(model_dir), CPU)
    algo = AlgorithmConfig(loss_agg_mode="token-mean", entropy={"coef": 0.01})
    cfg = ActorConfig(lr=1e-5, ppo_epochs=1, mini_batch_size=8, restrict_lm_head=restrict)
    return PolicyActor(
        model, actor=cfg, algorithm=algo, total_steps=10, mini_batch_rows=8, max_response_length=8, device=CPU
    )


def test_the_actor_update_runs_the_head_on_loss_mask_tokens_only(tiny_model_dir: Path) -> None:
    """`actor.restrict_lm_head` (default on) against false: the same loss, entropy and gradient norm from one
    on-policy update, with the head run on the 15 loss-mask-1 positions instead of every response position."""
    restricted, full = policy_actor(tiny_model_dir, restrict=True), policy_actor(tiny_model_dir, restrict=False)
    assert ActorConfig().restrict_lm_head
    vocab = restricted.model.config.vocab_size
    batch = agent_batch(vocab=min(vocab, 60))
    seen: dict[str, list[int]] = {"restricted": [], "full": []}
    metrics: dict[str, dict[str, float]] = {}
    for name, actor in (("restricted", restricted), ("full", full)):
        head = actor.model.get_output_embeddings()
        handle = head.register_forward_hook(lambda _m, _a, out, key=name: seen[key].append(out.shape[:-1].numel()))
        metrics[name] = actor.update_policy(batch.select(list(range(batch.batch_size))), temperature=0.8)
        handle.remove()
    for key in ("actor/pg_loss", "actor/entropy", "actor/entropy_loss", "actor/grad_norm"):
        assert metrics["restricted"][key] == pytest.approx(metrics["full"][key], rel=1e-5, abs=1e-7), key
    # the shared-prompt forward (default on): one logit row per distinct prompt (3), then the 11 wanted tokens
    # after column 0; the full head: one row per distinct prompt, then every response column of every row
    assert seen["restricted"] == [3, 11]
    assert seen["full"] == [3, batch.batch_size * batch.response_width]
