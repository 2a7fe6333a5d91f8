"""Validation under trainer.mode=async with max_staleness > 0 runs while the generator thread samples: it must not
depend on that thread (seeded sampling parameters, no save/restore of the shared global RNG)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_async_rl import ASYNC, trainer_for
from tiny_run import sum_rows

# the weights do not move (AdamW steps of ~1e-30 vanish in float32), so every validation samples the same policy
FROZEN = ["actor.lr=1e-30", "algorithm.kl.use_loss=false", "actor.weight_decay=0"]
VALIDATION = ["trainer.val_every=1", "rollout.val_temperature=1.0", "rollout.val_n=3"]


def validation_lines(run: Path) -> list[dict[str, float]]:
    """Each validation's sampled metrics (the engine's own timing metrics left out)."""
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [
        {k: v for k, v in line.items() if k.startswith("val/") and not k.startswith("val/rollout/")}
        for line in lines
        if "val/reward/mean" in line
    ]


def test_two_async_runs_with_the_same_seed_validate_the_same(tiny_model_dir: Path, tmp_path: Path) -> None:
    """Two runs at max_staleness 2, validating after every step while groups are still in flight, give the same
    validation metrics; with the weights frozen every validation gives the same ones too (seeded draws)."""
    hf = pytest.importorskip("rlloom.rollout.hf.engine")
    overrides = [*ASYNC, *FROZEN, *VALIDATION, "trainer.total_steps=3", "trainer.streaming.max_staleness=2"]
    runs = []
    for name in ("a", "b"):
        engine = hf.HFEngine.from_pretrained(str(tiny_model_dir))
        try:
            trainer = trainer_for(
                tiny_model_dir, tmp_path / name, overrides, engine=engine, val_data=sum_rows(4, seed=1)
            )
            trainer.fit()
        finally:
            engine.close()
        runs.append(validation_lines(tmp_path / name))
        steps = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
        # validation overlapped generation: groups of later steps were in flight when it started
        assert any(line.get("async/groups_in_flight", 0) + line.get("async/groups_waiting", 0) > 0 for line in steps)
    first, second = runs
    assert len(first) == len(second) == 3
    assert first == second
    assert first[0] == first[1] == first[2]
    assert first[0]["val/response_length/mean"] > 0.0
    # sampled, not greedy: the 3 samples of some prompt differ in reward
    assert any(k.endswith("/std@3") and v > 0 for k, v in first[0].items())
