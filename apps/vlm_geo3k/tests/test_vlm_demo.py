"""`vlm-geo3k demo`: the synthetic world, and the whole demo shortened (real engine, collector, trainer, rewards).

The slow test runs the default demo and asserts what its README states: GRPO raises the held-out accuracy of
sampled answers by a wide margin.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from rlloom_apps.vlm_geo3k.cli import main
from rlloom_apps.vlm_geo3k.demo import DemoSettings, run_demo
from rlloom_apps.vlm_geo3k.synthetic import COLORS, SIDE, make_pictures, to_rows


def test_pictures_show_their_colour(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pictures = make_pictures(30, seed=3)
    assert make_pictures(30, seed=3) == pictures  # seeded
    assert {p.color for p in pictures} <= set(COLORS) and len({p.color for p in pictures}) > 1
    for picture in pictures:
        pixels = np.asarray(picture.render())
        assert pixels.shape == (SIDE, SIDE, 3)
        inside = pixels[picture.top + picture.size // 2, picture.left + picture.size // 2]
        assert tuple(inside) == COLORS[picture.color]
    monkeypatch.chdir(tmp_path)
    rows = to_rows(pictures[:3], Path("images"), "train")  # a relative run folder, as `--out run` gives
    monkeypatch.chdir(tmp_path.parent)  # `vlm-geo3k eval --data run/held_out.jsonl` from another folder
    assert rows[0]["prompt"][0]["content"].startswith("<image>")
    assert Path(rows[0]["images"][0]).is_file() and rows[0]["reward_model"]["ground_truth"] == pictures[0].color


def test_short_demo_runs_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "run"
    settings = DemoSettings(train_pictures=24, held_out=8, warmup_max_steps=6, warmup_check_every=3, probe_rows=8)
    result = run_demo(
        output_dir=out,
        steps=2,
        settings=settings,
        # no dynamic sampling: a step whose groups all agree would skip its update and the mismatch check below
        overrides=[
            "data.train_batch_size=4",
            "rollout.n=2",
            "actor.mini_batch_size=4",
            "trainer.val_every=1",
            "algorithm.dynamic_sampling=false",
        ],
    )
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    val = [line for line in lines if "val/reward/mean" in line]
    assert [line["step"] for line in val] == [0, 1, 2]
    assert result.before_sampled == val[0]["val/reward/mean"] and result.after_sampled == val[-1]["val/reward/mean"]
    train = [line for line in lines if "reward/mean" in line]
    # the engine's and the actor's log-probs agree inside the trainer: images and M-RoPE positions line up
    assert len(train) == 2 and all(line["mismatch/mismatch_abs_logprob_diff_max"] < 1e-4 for line in train)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["before_grpo"] == {"sampled": result.before_sampled, "greedy": result.before_greedy}
    assert (out / "before_after.md").read_text().startswith("| held-out pictures")
    assert len(list((out / "images").glob("*.png"))) == 32
    assert 1 <= result.warmup_steps <= 6


def test_cli_refuses_bad_steps() -> None:
    with pytest.raises(SystemExit):
        main(["demo", "--steps", "0"])


LEARNING_STEPS = 15
SAMPLED_MARGIN = 0.1  # held-out sampled accuracy (64 pictures x 4 samples) must rise by this much


@pytest.mark.timeout(900)  # about 2 minutes idle: a loaded machine (3-6x slower) still fits
def test_short_fixed_seed_run_learns_to_read_the_colour(tmp_path: Path) -> None:
    """The demo's defaults and seed 0 (the same pictures, model and warm-up), cut to its first 15 GRPO steps
    (about 2 minutes on an idle 2-core machine, most of it the warm-up; the 40-step run stays in `nox -s
    demo-vlm`). Sampled held-out accuracy must rise by at least 0.1 and end above what any image-blind answer can
    score.

    Recorded for seed 0 (one torch thread): the warm-up stops after 190 steps; sampled accuracy at steps 0/5/10/15
    reads 0.133, 0.164, 0.242, 0.273 (greedy 0.48 -> 0.42; greedy moves by a few pictures either way, see the
    README). Why this is not chance: the run is seeded and repeats; one estimate's sampling spread
    over 256 samples is about 0.03 (binomial, p near 0.2), so +0.1 is over three of them on the same 64 pictures;
    and the question is the same for every picture, so an answer that ignores the image scores at most the most
    common colour's share of the held-out pictures (15/64 = 0.23 for seed 0), computed here from the pictures.
    """
    out = tmp_path / "run"
    result = run_demo(output_dir=out, steps=LEARNING_STEPS, seed=0, overrides=["trainer.val_every=5"])
    held_out = make_pictures(DemoSettings().held_out, 0 + 10_000)  # as run_demo draws them
    image_blind = max(Counter(p.color for p in held_out).values()) / len(held_out)
    assert result.after_sampled >= result.before_sampled + SAMPLED_MARGIN
    assert result.after_sampled > image_blind
    assert result.after_greedy >= result.before_greedy - 0.1  # GRPO at T=1 must not collapse the greedy answers
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    val = [(line["step"], line["val/reward/mean"]) for line in lines if "val/reward/mean" in line]
    assert [step for step, _ in val] == [0, 5, 10, LEARNING_STEPS]
    assert (val[0][1], val[-1][1]) == (result.before_sampled, result.after_sampled)
    assert (out / "checkpoints" / f"step_{LEARNING_STEPS}" / "model.safetensors").exists()


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("RLLOOM_FULL_DEMOS"), reason="the full demo: RLLOOM_FULL_DEMOS=1 to run it")
def test_default_demo_learns_from_reward(tmp_path: Path) -> None:
    """The whole demo (`nox -s demo-vlm`, 2.5-4 minutes on 2 cores). Opt-in, so a busy CI machine never times out
    on it; the short run above is what CI checks."""
    result = run_demo(output_dir=tmp_path / "run", seed=0)
    assert result.after_sampled - result.before_sampled >= 0.15
    # GRPO at T=1 trains the sampled policy; greedy answers over 64 pictures move by a few pictures between
    # float-rounding variants of the same run (0.48 -> 0.58 and 0.48 -> 0.45 for seed 0), so only a collapse fails
    assert result.after_greedy >= result.before_greedy - 0.1
