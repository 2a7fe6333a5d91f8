"""Progress lines during a step's long phases: at most one per interval, counts and rates worked by hand, and the
actor's update reporting `mini-batch i/n` through the trainer's PhaseTimer."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlloom.core_rl.observe import progress
from rlloom.core_rl.observe.metrics import PhaseTimer


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_one_line_per_interval_with_counts_tokens_and_rate() -> None:
    clock, lines = Clock(), []
    line = progress.ProgressLine("rollout", every_s=5.0, write=lines.append, clock=clock)
    clock.now = 102.0
    line.advance(8, tokens=400, unit="samples")  # 2 s in: too soon
    assert lines == []
    clock.now = 105.0
    line.advance(8, tokens=600, unit="samples")  # 5 s in: 16 samples, 1,000 tokens, 200 tokens/s
    clock.now = 107.0
    line.advance(8, tokens=500, unit="samples")  # 2 s after the last line: held back
    clock.now = 110.0
    line.advance(total=3, unit="mini-batch")  # a second unit joins the same line
    assert lines == [
        "[rollout] 16 samples, 1,000 tokens (200 tokens/s), 5 s",
        "[rollout] 24 samples; mini-batch 1/3, 1,500 tokens (150 tokens/s), 10 s",
    ]


def test_advance_reports_to_the_innermost_open_phase_and_is_a_no_op_outside() -> None:
    progress.advance(5, unit="samples")  # no phase: nothing happens, nothing raises
    outer_lines: list[str] = []
    inner_lines: list[str] = []
    with progress.phase("outer", every_s=0.0, write=outer_lines.append) as outer:
        with progress.phase("inner", every_s=0.0, write=inner_lines.append):
            progress.advance(2, unit="turns")
        progress.advance(1, unit="turns")
    assert [line.split(",")[0] for line in inner_lines] == ["[inner] 2 turns"]
    assert [line.split(",")[0] for line in outer_lines] == ["[outer] 1 turns"]
    assert outer.counts == {"turns": [1, None]}


def test_the_actors_update_reports_each_mini_batch_of_its_total(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from test_workers import make_actor, random_batch

    monkeypatch.setattr(progress, "EVERY_S", 0.0)  # a line at every report
    actor = make_actor(tiny_model_dir)  # 2 PPO epochs, mini-batches of 4 rows
    batch = random_batch(actor.model.config.vocab_size)  # 7 rows: 2 epochs x ceil(7 / 4) = 4 mini-batches
    batch["old_logprobs"], _ = actor.compute_logprobs(batch, temperature=1.0)
    timer = PhaseTimer()
    with timer("update_actor"):
        metrics = actor.update_policy(batch)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("[update_actor]")]
    assert [line.rsplit(",", 1)[0] for line in lines] == [f"[update_actor] mini-batch {i}/4" for i in range(1, 5)]
    assert metrics["actor/optimizer_steps"] == 4
