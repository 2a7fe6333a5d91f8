"""TrajectoryBatch: padding layout, select/concat/split, token-budget micro-batches, packing round trips."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlloom.core_rl.contracts.batch import TrajectoryBatch, scatter_rows
from rlloom.core_rl.contracts.packing import pack, token_budget_bins, unpack
from rlloom.core_rl.contracts.trajectory import Trajectory
from rlloom.core_rl.tiny import char_tokenizer, tiny_qwen2

PAD = 9


def traj(prompt: list[int], response: list[int], mask: list[int] | None = None, gid: str = "g") -> Trajectory:
    return Trajectory(
        prompt_ids=prompt,
        response_ids=response,
        loss_mask=mask if mask is not None else [1] * len(response),
        rollout_logprobs=[-0.5] * len(response),
        group_id=gid,
        reward=float(len(response)),
    )


def test_from_trajectories_layout() -> None:
    batch = TrajectoryBatch.from_trajectories(
        [traj([1, 2, 3], [4, 5]), traj([6], [7, 8, 10, 11], [1, 0, 0, 1], gid="h")], pad_token_id=PAD
    )
    assert batch.prompt_width == 3 and batch.response_width == 4
    assert batch["input_ids"].tolist() == [[1, 2, 3, 4, 5, PAD, PAD], [PAD, PAD, 6, 7, 8, 10, 11]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1, 1, 0, 0], [0, 0, 1, 1, 1, 1, 1]]
    assert batch["position_ids"].tolist() == [[0, 1, 2, 3, 4, 0, 0], [0, 0, 0, 1, 2, 3, 4]]
    assert batch.loss_mask.tolist() == [[1, 1, 0, 0], [1, 0, 0, 1]]
    assert batch.response_attention_mask.tolist() == [[1, 1, 0, 0], [1, 1, 1, 1]]
    assert batch["rollout_logprobs"].tolist() == [[-0.5, -0.5, 0, 0], [-0.5] * 4]
    assert batch["scores"].tolist() == [2.0, 4.0]
    assert batch.non_tensors["group_id"] == ["g", "h"]
    assert batch.responses.tolist() == [[4, 5, PAD, PAD], [7, 8, 10, 11]]


def test_mixed_logprobs_are_rejected() -> None:
    a = traj([1], [2])
    b = Trajectory(prompt_ids=[1], response_ids=[2], loss_mask=[1])
    with pytest.raises(ValueError, match="rollout_logprobs"):
        TrajectoryBatch.from_trajectories([a, b], pad_token_id=PAD)


def test_setitem_checks_shape() -> None:
    batch = TrajectoryBatch.from_trajectories([traj([1, 2], [3, 4, 5])], pad_token_id=PAD)
    batch["advantages"] = torch.ones(1, 3)
    with pytest.raises(ValueError, match="3 columns"):
        batch["values"] = torch.ones(1, 5)
    with pytest.raises(ValueError, match="batch dimension"):
        batch["values"] = torch.ones(2, 3)


def test_select_concat_roundtrip_with_different_widths() -> None:
    a = TrajectoryBatch.from_trajectories([traj([1, 2], [3]), traj([4], [5, 6])], pad_token_id=PAD)
    b = TrajectoryBatch.from_trajectories([traj([1, 2, 3, 4], [5, 6, 7], gid="x")], pad_token_id=PAD)
    a["advantages"] = torch.tensor([[1.0, 0.0], [2.0, 3.0]])
    b["advantages"] = torch.tensor([[4.0, 5.0, 6.0]])
    c = TrajectoryBatch.concat([a, b])
    assert c.prompt_width == 4 and c.response_width == 3
    assert c["input_ids"].tolist() == [
        [PAD, PAD, 1, 2, 3, PAD, PAD],
        [PAD, PAD, PAD, 4, 5, 6, PAD],
        [1, 2, 3, 4, 5, 6, 7],
    ]
    assert c["advantages"].tolist() == [[1, 0, 0], [2, 3, 0], [4, 5, 6]]
    assert c["position_ids"].tolist()[1] == [0, 0, 0, 0, 1, 2, 0]
    assert c.non_tensors["group_id"] == ["g", "g", "x"]
    # select + trim gives back the original rows exactly
    back = c.select([0, 1]).trimmed()
    for key in a.tensors:
        assert torch.equal(back[key], a[key]), key


def test_concat_rejects_mismatched_keys() -> None:
    a = TrajectoryBatch.from_trajectories([traj([1], [2])], pad_token_id=PAD)
    b = TrajectoryBatch.from_trajectories([traj([1], [2])], pad_token_id=PAD)
    a["values"] = torch.zeros(1, 1)
    with pytest.raises(ValueError, match="values"):
        TrajectoryBatch.concat([a, b])


def test_split_keeps_remainder() -> None:
    batch = TrajectoryBatch.from_trajectories([traj([1], [i + 2]) for i in range(7)], pad_token_id=PAD)
    parts = batch.split(3)
    assert [len(p) for p in parts] == [3, 3, 1]
    assert torch.equal(TrajectoryBatch.concat(parts)["input_ids"], batch["input_ids"])


@settings(max_examples=60, deadline=None)
@given(
    rows=st.lists(
        st.tuples(st.integers(min_value=1, max_value=20), st.integers(min_value=0, max_value=20)),
        min_size=1,
        max_size=30,
    ),
    budget=st.integers(min_value=1, max_value=120),
    padded=st.booleans(),
)
def test_token_budget_bins_cover_every_row_once_within_budget(
    rows: list[tuple[int, int]], budget: int, padded: bool
) -> None:
    lengths = [p + r for p, r in rows]
    plens = [p for p, _ in rows]
    bins = token_budget_bins(lengths, budget, padded=padded, prompt_lengths=plens)
    assert sorted(i for b in bins for i in b) == list(range(len(lengths)))
    for b in bins:
        width = max(plens[i] for i in b) + max(lengths[i] - plens[i] for i in b)
        cost = len(b) * width if padded else sum(lengths[i] for i in b)
        assert cost <= budget or len(b) == 1  # only a lone over-long row may exceed the budget


def test_token_budget_bins_pack_tightly() -> None:
    # packed: 6+4 and 5+5 fill two bins of 10 exactly; first-fit decreasing finds it
    assert sorted(token_budget_bins([6, 5, 5, 4], 10, padded=False)) == [[0, 3], [1, 2]]
    # padded: a bin costs rows x longest row
    assert token_budget_bins([4, 4, 4, 1], 8, padded=True) == [[0, 1], [2, 3]]


def test_micro_batches_and_scatter_rows() -> None:
    trajs = [traj([1] * (i % 3 + 1), [2] * (i % 4 + 1)) for i in range(9)]
    batch = TrajectoryBatch.from_trajectories(trajs, pad_token_id=PAD)
    micro = batch.micro_batches(12, padded=True)
    assert sorted(r for rows, _ in micro for r in rows) == list(range(9))
    for rows, mb in micro:
        assert mb["input_ids"].numel() <= 12 or len(rows) == 1
    # per-micro-batch response tensors reassemble into the full batch
    parts = [(rows, mb["loss_mask"].float()) for rows, mb in micro]
    assert torch.equal(scatter_rows(parts, len(batch), batch.response_width), batch.loss_mask.float())


@settings(max_examples=40, deadline=None)
@given(
    rows=st.lists(
        st.tuples(st.integers(min_value=1, max_value=6), st.integers(min_value=0, max_value=6)),
        min_size=1,
        max_size=6,
    )
)
def test_pack_unpack_is_identity(rows: list[tuple[int, int]]) -> None:
    batch = TrajectoryBatch.from_trajectories(
        [traj(list(range(1, p + 1)), list(range(20, 20 + r))) for p, r in rows], pad_token_id=PAD
    )
    packed = pack(batch["input_ids"], batch["attention_mask"])
    assert packed.input_ids.shape == (1, int(batch["attention_mask"].sum()))
    restored = unpack(packed.input_ids, packed, fill=PAD)
    assert torch.equal(restored, batch["input_ids"])
    # positions restart per sequence and match the padded layout's positions on real tokens
    mask = batch["attention_mask"].bool()
    assert torch.equal(unpack(packed.position_ids, packed)[mask], batch["position_ids"][mask])
    assert packed.cu_seqlens.tolist()[-1] == packed.input_ids.shape[1]
    assert packed.max_seqlen == int(batch.seq_lengths.max())


def test_packed_logprobs_equal_padded() -> None:
    tok = char_tokenizer()
    model = tiny_qwen2(tok).eval()
    gen = torch.Generator().manual_seed(0)
    trajs = []
    for p, r in [(5, 7), (2, 3), (8, 1), (3, 9)]:
        ids = torch.randint(10, len(tok), (p + r,), generator=gen).tolist()
        trajs.append(traj(ids[:p], ids[p:]))
    batch = TrajectoryBatch.from_trajectories(trajs, pad_token_id=tok.pad_token_id)
    width_p = batch.prompt_width

    def token_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(logits.float(), -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)

    with torch.no_grad():
        padded_logits = model(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            position_ids=batch["position_ids"],
        ).logits
        padded = token_logprobs(padded_logits[:, width_p - 1 : -1], batch.responses)

        packed = pack(batch["input_ids"], batch["attention_mask"])
        logits = model(input_ids=packed.input_ids, position_ids=packed.position_ids, use_cache=False).logits[0]
        next_ids = torch.roll(packed.input_ids[0], -1)  # across a boundary the value is junk and lands on padding
        per_token = unpack(token_logprobs(logits, next_ids), packed)
        packed_lp = per_token[:, width_p - 1 : -1]
    mask = batch.loss_mask.bool()
    torch.testing.assert_close(packed_lp[mask], padded[mask], rtol=1e-5, atol=1e-5)
