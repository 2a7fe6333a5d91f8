"""The multimodal forward convention: which rows get their own forward and how their M-RoPE positions continue."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from rlloom.core_rl.contracts.batch import TrajectoryBatch
from rlloom.core_rl.contracts.trajectory import Trajectory
from rlloom.core_rl.workers.forward import continue_rope_positions, response_hidden_states, rope_rows


def test_response_tokens_continue_one_past_the_largest_position_on_all_rows() -> None:
    # text 0..1, a 2 x 3 image grid starting at 2 (height row reaches 3, width row reaches 4), text from 5
    prompt = torch.tensor(
        [
            [0, 1, 2, 2, 2, 2, 2, 2, 5],
            [0, 1, 2, 2, 2, 3, 3, 3, 5],
            [0, 1, 2, 3, 4, 2, 3, 4, 5],
        ]
    )
    out = continue_rope_positions(prompt, 3)
    assert out.shape == (3, 12) and out.dtype == prompt.dtype
    assert torch.equal(out[:, :9], prompt)
    assert torch.equal(out[:, 9:], torch.tensor([[6, 7, 8]] * 3))
    # an image at the end: its width row (7) outruns the text row, and the response starts past it
    ends_in_image = torch.tensor([[0, 1, 2, 2], [0, 1, 2, 3], [0, 1, 6, 7]])
    assert continue_rope_positions(ends_in_image, 2)[:, 4:].tolist() == [[8, 9]] * 3
    assert torch.equal(continue_rope_positions(prompt, 0), prompt)


def _traj(n_prompt: int, multimodal: dict[str, object] | None) -> Trajectory:
    return Trajectory(prompt_ids=[1] * n_prompt, response_ids=[2, 3], loss_mask=[1, 1], multimodal=multimodal)


def test_only_rows_with_prompt_positions_get_their_own_forward() -> None:
    positions = torch.arange(3).expand(3, -1)
    batch = TrajectoryBatch.from_trajectories(
        [_traj(3, {"position_ids": positions}), _traj(2, None), _traj(3, {"image": "x.png"}), _traj(3, {})],
        pad_token_id=0,
    )
    assert rope_rows(batch) == [0]
    assert rope_rows(batch.select([1, 2, 3])) == []
    # the critic's states take the same route: text rows in one batched forward, the M-RoPE row alone with its
    # prompt positions continued over the response
    backbone = RecordingBackbone()
    states = response_hidden_states(backbone, batch)
    assert backbone.calls == [(3, None), (1, (3, 1, 5))]
    assert states.shape == (4, batch.response_width, 2)
    # a row's states are those of the tokens before each response token: the last prompt token (1), then 2
    assert states[0, :, 0].tolist() == [1.0, 2.0]
    assert states[1, :, 0].tolist() == [1.0, 2.0]


class RecordingBackbone(torch.nn.Module):
    """A stand-in backbone whose hidden state is the token id, recording (rows, M-RoPE position shape) per call."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[int, tuple[int, ...] | None]] = []

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor | None = None, **_: object) -> object:
        rope = tuple(position_ids.shape) if position_ids is not None and position_ids.dim() == 3 else None
        self.calls.append((int(input_ids.shape[0]), rope))
        return SimpleNamespace(last_hidden_state=input_ids.float()[..., None].expand(*input_ids.shape, 2))
