"""In-process workers: log-probs against an unpadded reference forward; updates that do not depend on how the
batch is cut into micro-batches or whether it is packed; the critic learns returns."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from rlloom.core_rl.config.schema import ActorConfig, AlgorithmConfig, CriticConfig, ModelConfig
from rlloom.core_rl.contracts.batch import TrajectoryBatch
from rlloom.core_rl.contracts.trajectory import Trajectory
from rlloom.core_rl.workers.actor import PolicyActor, load_causal_lm
from rlloom.core_rl.workers.critic import ValueCritic, ValueModel

CPU = torch.device("cpu")


def random_batch(vocab: int, seed: int = 0) -> TrajectoryBatch:
    gen = torch.Generator().manual_seed(seed)
    trajs = []
    for i, (p, r) in enumerate([(4, 9), (7, 3), (2, 6), (5, 5), (3, 8), (6, 2), (4, 4)]):
        ids = torch.randint(10, vocab, (p + r,), generator=gen).tolist()
        mask = [1] * r
        if r > 4:
            mask[2] = 0  # an observation token inside the response (multi-turn)
        trajs.append(Trajectory(prompt_ids=ids[:p], response_ids=ids[p:], loss_mask=mask, group_id=str(i // 2)))
    batch = TrajectoryBatch.from_trajectories(trajs, pad_token_id=3)
    batch["advantages"] = torch.randn(batch.loss_mask.shape, generator=gen) * batch.loss_mask
    return batch


def make_actor(model_dir: Path, **actor_kwargs: object) -> PolicyActor:
    model = load_causal_lm(ModelConfig(path=str(model_dir)), str(model_dir), CPU)
    algo = AlgorithmConfig(entropy={"coef": 0.01}, loss_agg_mode="seq-mean-token-mean", clip_high=0.28)
    cfg = ActorConfig(lr=1e-3, ppo_epochs=2, mini_batch_size=2, shuffle=True, **actor_kwargs)  # type: ignore[arg-type]
    return PolicyActor(
        model, actor=cfg, algorithm=algo, total_steps=10, mini_batch_rows=4, max_response_length=9, device=CPU
    )


@pytest.mark.parametrize("padding_free", [False, True])
def test_logprobs_match_unpadded_forward(tiny_model_dir: Path, padding_free: bool) -> None:
    actor = make_actor(tiny_model_dir, max_tokens_per_micro_batch=30, padding_free=padding_free)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    batch = random_batch(model.config.vocab_size)
    logprobs, entropy = actor.compute_logprobs(batch, temperature=0.7, entropy=True)
    assert entropy is not None
    for i in range(batch.batch_size):
        plen, rlen = int(batch["prompt_lengths"][i]), int(batch["response_lengths"][i])
        ids = batch["input_ids"][i][batch["attention_mask"][i].bool()].unsqueeze(0)
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, plen - 1 : -1] / 0.7
        expected = torch.log_softmax(logits, -1).gather(-1, ids[0, plen:, None]).squeeze(-1)
        probs = torch.softmax(logits, -1)
        expected_entropy = -(probs * torch.log(probs)).sum(-1)
        torch.testing.assert_close(logprobs[i, :rlen], expected, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(entropy[i, :rlen], expected_entropy, rtol=1e-5, atol=1e-5)
        assert torch.all(logprobs[i, rlen:] == 0)


@pytest.mark.parametrize("padding_free", [False, True])
def test_lm_head_runs_only_on_positions_that_score_the_response(tiny_model_dir: Path, padding_free: bool) -> None:
    """The prompt's logits are never computed: the LM head sees one position per response token (plus, padded,
    the last column, which scores nothing)."""
    actor = make_actor(tiny_model_dir, max_tokens_per_micro_batch=10_000, padding_free=padding_free)
    batch = random_batch(actor.model.config.vocab_size)
    seen: list[int] = []
    hook = actor.model.lm_head.register_forward_hook(lambda _m, args, _out: seen.append(args[0].shape[:-1].numel()))
    try:
        actor.compute_logprobs(batch, temperature=1.0)
    finally:
        hook.remove()
    lengths = [int(x) for x in batch["response_lengths"]]
    # packed: each row's last prompt token and all its response tokens but the last, and its last real token's
    # junk next-token score when the row is shorter than the widest response (dropped as padding afterwards)
    expected = (
        sum(min(n + 1, batch.response_width) for n in lengths)
        if padding_free
        else batch.batch_size * (batch.response_width + 1)
    )
    assert seen == [expected]
    # what the whole forward would have sent through the LM head: every real token, or every padded column
    whole = int(batch["attention_mask"].sum()) if padding_free else batch["input_ids"].numel()
    assert expected < whole


def updated_params(model_dir: Path, **actor_kwargs: object) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    actor = make_actor(model_dir, **actor_kwargs)
    batch = random_batch(actor.model.config.vocab_size)
    old, _ = actor.compute_logprobs(batch, temperature=1.0)
    batch["old_logprobs"] = old - 0.05 * batch.loss_mask  # off-policy enough that some ratios clip
    metrics = actor.update_policy(batch)
    return {k: v.detach().clone() for k, v in actor.model.named_parameters()}, metrics


def test_update_is_independent_of_micro_batching_and_packing(tiny_model_dir: Path) -> None:
    whole, m_whole = updated_params(tiny_model_dir, max_tokens_per_micro_batch=10_000)
    micro, m_micro = updated_params(tiny_model_dir, max_tokens_per_micro_batch=20)
    packed, m_packed = updated_params(tiny_model_dir, max_tokens_per_micro_batch=25, padding_free=True)
    initial = dict(AutoModelForCausalLM.from_pretrained(tiny_model_dir).named_parameters())
    assert any(not torch.equal(whole[k], initial[k]) for k in whole)  # the update did something
    # Adam divides by sqrt(v), which amplifies float rounding on near-zero gradients: 1e-5 is 1% of one step
    for name in whole:
        torch.testing.assert_close(micro[name], whole[name], rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(packed[name], whole[name], rtol=1e-4, atol=1e-5)
    # the gradient norm is scale-sensitive, so per-micro-batch normalisation would show here
    for key in ("actor/pg_loss", "actor/pg_clipfrac", "actor/grad_norm", "actor/entropy_loss"):
        assert abs(m_micro[key] - m_whole[key]) <= 1e-5 * max(1.0, abs(m_whole[key])), key
        assert abs(m_packed[key] - m_whole[key]) <= 1e-5 * max(1.0, abs(m_whole[key])), key
    # 7 rows in mini-batches of 4 over 2 epochs: 2 optimizer steps per epoch, the second with 3 rows
    assert m_whole["actor/optimizer_steps"] == 4.0
    assert m_whole["actor/pg_clipfrac"] > 0


def test_bnpo_gradient_is_the_mean_of_micro_batch_token_means(tiny_model_dir: Path) -> None:
    """The actor's bnpo update against TRL's formula written out here: for each micro-batch the actor forms, the
    PPO loss's token mean over that micro-batch divided by the number of micro-batches; the actor reports the
    gradient norm it stepped with, and with a whole-batch budget bnpo is plain token-mean."""
    from rlloom.core_rl.algorithms import ppo_policy_loss
    from rlloom.core_rl.workers.forward import response_logprobs

    def bnpo_actor(budget: int, mode: str = "bnpo") -> PolicyActor:
        model = load_causal_lm(ModelConfig(path=str(tiny_model_dir)), str(tiny_model_dir), CPU)
        algo = AlgorithmConfig(loss_agg_mode=mode, clip_high=0.28)
        cfg = ActorConfig(lr=1e-3, ppo_epochs=1, mini_batch_size=8, shuffle=False, max_tokens_per_micro_batch=budget)
        return PolicyActor(
            model, actor=cfg, algorithm=algo, total_steps=10, mini_batch_rows=8, max_response_length=9, device=CPU
        )

    actor = bnpo_actor(budget=20)
    batch = random_batch(actor.model.config.vocab_size)
    old, _ = actor.compute_logprobs(batch, temperature=1.0)
    batch["old_logprobs"] = old - 0.05 * batch.loss_mask
    micro_batches = [micro for _, micro in batch.micro_batches(20, padded=True)]
    assert len(micro_batches) > 1
    for micro in micro_batches:  # TRL's bnpo, by hand, on a fresh copy of the same weights
        logprobs, _ = response_logprobs(actor.model, micro, temperature=1.0)
        loss, _ = ppo_policy_loss(
            logprobs, micro["old_logprobs"], micro["advantages"], micro.loss_mask, clip_low=0.2, clip_high=0.28
        )
        (loss / len(micro_batches)).backward()  # type: ignore[no-untyped-call]
    expected_norm = float(
        torch.nn.utils.get_total_norm([p.grad for p in actor.model.parameters() if p.grad is not None])
    )
    actor.model.zero_grad(set_to_none=True)

    metrics = actor.update_policy(batch)
    assert metrics["actor/grad_norm"] == pytest.approx(expected_norm, rel=1e-5)
    token_mean = bnpo_actor(budget=20, mode="token-mean").update_policy(batch)
    assert abs(token_mean["actor/grad_norm"] - expected_norm) > 1e-3 * expected_norm  # the modes differ here
    whole_bnpo = bnpo_actor(budget=10_000).update_policy(batch)
    whole_token_mean = bnpo_actor(budget=10_000, mode="token-mean").update_policy(batch)
    assert whole_bnpo["actor/grad_norm"] == pytest.approx(whole_token_mean["actor/grad_norm"], rel=1e-6)


def on_policy_actor(model_dir: Path, **actor_kwargs: object) -> PolicyActor:
    """One epoch, one mini-batch for random_batch's 7 rows: a single optimizer step, as GRPO configs often take."""
    model = load_causal_lm(ModelConfig(path=str(model_dir)), str(model_dir), CPU)
    algo = AlgorithmConfig(loss_agg_mode="token-mean", kl_loss_type="k3")
    cfg = ActorConfig(lr=1e-3, ppo_epochs=1, mini_batch_size=8, **actor_kwargs)  # type: ignore[arg-type]
    return PolicyActor(
        model, actor=cfg, algorithm=algo, total_steps=10, mini_batch_rows=8, max_response_length=9, device=CPU
    )


@pytest.mark.parametrize("padding_free", [False, True])
def test_single_update_without_old_logprobs_matches_the_recomputed_ones(
    tiny_model_dir: Path, padding_free: bool
) -> None:
    """With one optimizer step the old log-probs are the current ones: leaving them out (the update detaches its
    own) gives the weights a separate forward would, and the same entropy, reference-KL and mismatch figures."""
    # The full LM head in both updates, as in compute_logprobs: the same arithmetic, so the recomputed ratio is
    # exactly 1 too (the restricted head is checked against the full one in test_update_head_restriction.py).
    kwargs = {"max_tokens_per_micro_batch": 25, "padding_free": padding_free, "restrict_lm_head": False}
    recomputing, fused = on_policy_actor(tiny_model_dir, **kwargs), on_policy_actor(tiny_model_dir, **kwargs)
    batch = random_batch(recomputing.model.config.vocab_size)
    gen = torch.Generator().manual_seed(1)
    old, entropy = recomputing.compute_logprobs(batch, temperature=0.7, entropy=True)
    assert entropy is not None
    batch["rollout_logprobs"] = (old + 0.02 * torch.randn(old.shape, generator=gen)) * batch.loss_mask
    batch["ref_logprobs"] = (old - 0.1 * torch.rand(old.shape, generator=gen)) * batch.loss_mask
    recomputed = batch.select(list(range(batch.batch_size)))
    recomputed["old_logprobs"] = old
    m_recomputed = recomputing.update_policy(recomputed, temperature=0.7)
    m_fused = fused.update_policy(batch, temperature=0.7)

    changed = False
    initial = dict(AutoModelForCausalLM.from_pretrained(tiny_model_dir).named_parameters())
    for (name, a), (_, b) in zip(recomputing.model.named_parameters(), fused.model.named_parameters(), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)
        changed |= not torch.equal(a, initial[name])
    assert changed
    mask = batch.loss_mask.bool()
    delta = old - batch["rollout_logprobs"]
    expected = {
        "actor/entropy": float(entropy[mask].mean()),
        "actor/kl_mean": float(
            (torch.exp(batch["ref_logprobs"] - old) - (batch["ref_logprobs"] - old) - 1)[mask].mean()
        ),
        "mismatch/mismatch_kl_k1": float(-delta[mask].mean()),
        "mismatch/mismatch_abs_logprob_diff_mean": float(delta.abs()[mask].mean()),
        "mismatch/mismatch_abs_logprob_diff_max": float(delta.abs()[mask].max()),  # a max over micro-batches
        "mismatch/mismatch_ratio_mean": float(delta.exp()[mask].mean()),
    }
    for key, value in expected.items():
        assert m_fused[key] == pytest.approx(value, rel=1e-4, abs=1e-6), key
    assert m_fused["actor/pg_clipfrac"] == 0.0  # ratio exactly 1
    assert m_fused["actor/grad_norm"] == pytest.approx(m_recomputed["actor/grad_norm"], rel=1e-4)


def test_update_without_old_logprobs_is_refused_when_the_weights_move_between_steps(tiny_model_dir: Path) -> None:
    actor = make_actor(tiny_model_dir)  # 2 epochs over mini-batches of 4 rows: 4 optimizer steps
    batch = random_batch(actor.model.config.vocab_size)
    assert not actor.single_update(batch.batch_size)
    with pytest.raises(KeyError, match="lacks 'old_logprobs'.*compute_logprobs"):
        actor.update_policy(batch)


def test_critic_starts_at_zero_and_learns_returns(tiny_model_dir: Path) -> None:
    cfg = CriticConfig(lr=3e-3, ppo_epochs=4, mini_batch_size=4, value_clip=None, max_tokens_per_micro_batch=40)
    critic = ValueCritic(
        ValueModel.from_pretrained(ModelConfig(path=str(tiny_model_dir)), str(tiny_model_dir)),
        critic=cfg,
        loss_agg_mode="token-mean",
        total_steps=10,
        mini_batch_rows=4,
        device=CPU,
    )
    batch = random_batch(100)
    values = critic.compute_values(batch)
    assert torch.all(values == 0)
    batch["returns"] = torch.full(values.shape, 0.5) * batch.loss_mask
    losses = []
    for _ in range(3):
        batch["values"] = critic.compute_values(batch)
        losses.append(critic.update_critic(batch)["critic/vf_loss"])
    assert losses[-1] < 0.5 * losses[0]


@pytest.mark.parametrize("packed", [False, True])
def test_models_without_logits_to_keep_get_the_same_logprobs(tiny_model_dir: Path, packed: bool) -> None:
    """A forward that does not take `logits_to_keep` returns every position; the slicing finds the same ones."""
    from torch import nn

    from rlloom.core_rl.workers.forward import keep_logits, response_logprobs

    class FullLogits(nn.Module):
        def __init__(self, inner: nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, input_ids: torch.Tensor, **kwargs: object) -> object:
            return self.inner(input_ids=input_ids, **kwargs)

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    wrapped = FullLogits(model)
    assert keep_logits(model, 3) == {"logits_to_keep": 3} and keep_logits(wrapped, 3) == {}
    batch = random_batch(model.config.vocab_size)
    with torch.no_grad():
        fast, fast_ent = response_logprobs(model, batch, temperature=0.7, packed=packed, entropy=True)
        full, full_ent = response_logprobs(wrapped, batch, temperature=0.7, packed=packed, entropy=True)
    torch.testing.assert_close(fast, full, rtol=1e-5, atol=1e-5)
    assert fast_ent is not None and full_ent is not None
    torch.testing.assert_close(fast_ent, full_ent, rtol=1e-5, atol=1e-5)
