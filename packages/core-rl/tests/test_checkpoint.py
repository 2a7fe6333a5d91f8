"""Checkpoints are atomic: a crash mid-save leaves the previous checkpoint and `latest` intact."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import torch

from rlloom.core_rl.run.checkpoint import (
    latest_checkpoint,
    load_trainer_state,
    rng_state,
    save_checkpoint,
    set_rng_state,
)


def write_weights(path: Path) -> None:
    (path / "model.bin").write_bytes(b"weights")


def save(root: Path, step: int, keep_last: int = 2) -> Path:
    return save_checkpoint(
        root, step, write_model=write_weights, trainer_state={"step": step}, config_yaml="a: 1\n", keep_last=keep_last
    )


def test_latest_pointer_and_keep_last(tmp_path: Path) -> None:
    for step in (1, 2, 3):
        save(tmp_path, step)
    assert sorted(p.name for p in tmp_path.glob("step_*")) == ["step_2", "step_3"]
    assert latest_checkpoint(tmp_path) == tmp_path / "step_3"
    assert load_trainer_state(tmp_path / "step_3")["step"] == 3
    assert (tmp_path / "step_3" / "config.yaml").read_text() == "a: 1\n"


def test_crash_mid_save_keeps_previous_checkpoint(tmp_path: Path) -> None:
    save(tmp_path, 1)

    def crash(path: Path) -> None:
        (path / "model.bin").write_bytes(b"half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(tmp_path, 2, write_model=crash, trainer_state={"step": 2}, config_yaml="", keep_last=2)
    assert latest_checkpoint(tmp_path) == tmp_path / "step_1"
    assert not (tmp_path / "step_2").exists()
    assert (tmp_path / "step_1" / "model.bin").read_bytes() == b"weights"
    # the next successful save replaces the partial temporary directory
    save(tmp_path, 2)
    assert latest_checkpoint(tmp_path) == tmp_path / "step_2"


def test_missing_pointer_falls_back_to_highest_complete_step(tmp_path: Path) -> None:
    save(tmp_path, 4, keep_last=5)
    save(tmp_path, 10, keep_last=5)
    (tmp_path / "latest").unlink()
    (tmp_path / "step_12").mkdir()  # incomplete: no trainer_state.pt
    assert latest_checkpoint(tmp_path) == tmp_path / "step_10"
    assert latest_checkpoint(tmp_path / "nothing") is None
    with pytest.raises(FileNotFoundError, match="trainer_state.pt"):
        load_trainer_state(tmp_path / "step_12")


def test_rng_state_round_trip() -> None:
    state = rng_state()
    first = (random.random(), float(np.random.rand()), float(torch.rand(())))
    set_rng_state(state)
    assert (random.random(), float(np.random.rand()), float(torch.rand(()))) == first


@pytest.mark.parametrize("keep_last", [1, 2])
def test_saving_after_a_resume_from_an_earlier_step_keeps_the_new_checkpoint(tmp_path: Path, keep_last: int) -> None:
    """trainer.resume=<step_4> in a folder that also holds step_6: the rewound run's step_5 is the latest, and it
    must survive pruning (the stale step_6 goes first), or an auto-resume would continue the abandoned run."""
    for step in (4, 6):
        save(tmp_path, step, keep_last=2)
    new = save(tmp_path, 5, keep_last=keep_last)
    assert new.is_dir()
    assert latest_checkpoint(tmp_path) == tmp_path / "step_5"
    expected = ["step_5"] if keep_last == 1 else ["step_4", "step_5"]
    assert sorted(p.name for p in tmp_path.glob("step_*")) == expected
    (tmp_path / "latest").unlink()  # the highest-step fallback finds the same one
    assert latest_checkpoint(tmp_path) == tmp_path / "step_5"


def test_a_crash_during_a_resave_leaves_no_checkpoint_behind(tmp_path: Path) -> None:
    """A re-save moves step_N aside as .old_step_N_<pid> first; pruning never looked at those, so each crash there
    left a whole checkpoint on disk. Now the next save or resume deletes it, or puts it back when the new step_N
    never arrived."""
    save(tmp_path, 1)
    save(tmp_path, 2)
    # a crash after the new step_2 was in place, before the old one was deleted
    (tmp_path / "step_2").rename(tmp_path / ".old_step_2_999999")
    save(tmp_path, 2)
    # a crash after step_1 was moved aside, before its new copy arrived
    (tmp_path / "step_1").rename(tmp_path / ".old_step_1_999998")
    save(tmp_path, 3)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith((".old", "step_"))) == ["step_2", "step_3"]
    (tmp_path / "step_3").rename(tmp_path / ".old_step_3_999997")  # the only copy of the latest step
    assert latest_checkpoint(tmp_path) == tmp_path / "step_3"
    assert load_trainer_state(tmp_path / "step_3")["step"] == 3
    assert not list(tmp_path.glob(".old_step_*"))
