"""supervised_loss equals transformers' own labels loss on text rows; supervised_train learns and stops early,
skips masked observation tokens of agent conversations and refuses data with nothing to learn."""

from __future__ import annotations

import copy

import pytest
import torch

from rlloom.core_rl.contracts.trajectory import Trajectory
from rlloom.core_rl.tiny import char_tokenizer, tiny_qwen2
from rlloom.core_rl.workers.supervised import supervised_loss, supervised_train


def traj(tok, prompt: str, response: str, mask: list[int] | None = None) -> Trajectory:  # type: ignore[no-untyped-def]
    p = tok(prompt, add_special_tokens=False)["input_ids"]
    r = tok(response, add_special_tokens=False)["input_ids"]
    return Trajectory(prompt_ids=p, response_ids=r, loss_mask=mask or [1] * len(r))


def test_loss_equals_transformers_labels_loss() -> None:
    tok = char_tokenizer()
    model = tiny_qwen2(tok, seed=0).eval()
    trajectories = [traj(tok, "12+3=", "15"), traj(tok, "7+7=", "14 ok", [1, 1, 0, 0, 0])]
    ours = supervised_loss(model, trajectories, pad_token_id=tok.pad_token_id)
    # independent: per row, transformers' CE with labels on the trained tokens only, token-weighted over the batch
    total, count = 0.0, 0
    for t in trajectories:
        ids = torch.tensor([t.prompt_ids + t.response_ids])
        labels = torch.tensor(
            [[-100] * len(t.prompt_ids) + [x if m else -100 for x, m in zip(t.response_ids, t.loss_mask, strict=True)]]
        )
        n = int((labels != -100).sum())
        total += float(model(input_ids=ids, labels=labels).loss) * n
        count += n
    assert float(ours) == pytest.approx(total / count, rel=1e-5)


def test_train_learns_and_stops_early() -> None:
    tok = char_tokenizer()
    model = tiny_qwen2(tok, seed=0)
    data = [traj(tok, f"{a}+{a}=", str(2 * a)) for a in range(10)]
    checked: list[int] = []

    def stop(step: int) -> bool:
        checked.append(step)
        return step >= 60

    losses = supervised_train(model, data, pad_token_id=tok.pad_token_id, steps=500, lr=3e-3, stop=stop, progress=False)
    assert len(losses) == 60 and checked == [20, 40, 60]
    assert sum(losses[-10:]) / 10 < 0.5 * sum(losses[:10]) / 10
    with pytest.raises(ValueError, match="no response token has loss mask 1"):
        supervised_loss(model, [traj(tok, "1+1=", "2", [0])], pad_token_id=tok.pad_token_id)


def test_agent_conversation_trains_only_the_model_turns() -> None:
    # prompt [5, 6], the model writes [7, 8], an observation [9, 10] (mask 0), the model writes [11]
    conversation = Trajectory(prompt_ids=[5, 6], response_ids=[7, 8, 9, 10, 11], loss_mask=[1, 1, 0, 0, 1])
    tok = char_tokenizer()
    model = tiny_qwen2(tok, seed=0)
    reference = copy.deepcopy(model)
    with torch.no_grad():
        logits = reference(input_ids=torch.tensor([[5, 6, 7, 8, 9, 10, 11]])).logits[0]
    # next-token predictions at positions 1, 2 and 5 are for tokens 7, 8 and 11; 9 and 10 are context
    expected = torch.nn.functional.cross_entropy(logits[[1, 2, 5]], torch.tensor([7, 8, 11]))
    nothing_to_learn = Trajectory(prompt_ids=[5], response_ids=[9], loss_mask=[0])
    losses = supervised_train(
        model, [conversation, nothing_to_learn], pad_token_id=tok.pad_token_id, steps=30, batch_size=2, lr=1e-2,
        progress=False,
    )  # fmt: skip
    assert losses[0] == pytest.approx(float(expected), rel=1e-5)  # the masked-only row was never drawn
    assert losses[-1] < losses[0] / 4
    assert not model.training


def test_train_refuses_data_without_a_trained_token() -> None:
    tok = char_tokenizer()
    with pytest.raises(ValueError, match="none has a loss-mask-1 token"):
        supervised_train(
            tiny_qwen2(tok), [traj(tok, "1+1=", "2", [0])], pad_token_id=tok.pad_token_id, steps=1, progress=False
        )
    with pytest.raises(ValueError, match="check_every >= 1"):
        supervised_train(tiny_qwen2(tok), [], pad_token_id=tok.pad_token_id, steps=0, check_every=0)
