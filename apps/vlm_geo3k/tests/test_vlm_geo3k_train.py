"""`vlm-geo3k train`: real Geometry3K rows through the vision collector, then GRPO steps on a tiny Qwen2.5-VL.

The image-token counts are worked out by hand from the diagram sizes (fit to the pixel budget, then round each
side to a multiple of 28); the trainer's own `mismatch/` metrics show the engine's sampling log-probs and the
actor's teacher-forced ones agree on image prompts inside the real loop; the checkpoint loads back.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from rlloom_apps.vlm_geo3k.cli import main
from rlloom_apps.vlm_geo3k.data import to_row
from rlloom_apps.vlm_geo3k.train import config_file, load_config

from rlloom.core_rl.config.schema import ConfigError, ModelConfig
from rlloom.core_rl.contracts import SamplingParams
from rlloom.core_rl.workers.actor import load_causal_lm
from rlloom.multimodal.collection import vision_collector
from rlloom.multimodal.qwen_vl import QwenVLProcessing, VisionTokenIds
from rlloom.multimodal.tiny import save_tiny_vl_model
from rlloom.rollout import HFEngine

DATA = Path(__file__).parent / "data"
SHARED = Path("/work/shared/data/geometry3k_examples")  # all 10 InterGPS examples, where this checkout has them
BUDGET = QwenVLProcessing(min_pixels=56 * 56, max_pixels=112 * 112)
# (width, height) -> fit into 112*112 pixels by sqrt(12544 / area), truncated -> each side rounded to 28s:
# 11: 250x251 -> 111x112 -> 112x112: 8x8 patches; 12: 336x257 -> 128x97 -> 140x84: 10 wide, 6 high;
# 14: 628x453 -> 131x95 -> 140x84; 20: 301x116 -> 180x69 -> 168x56: 12 wide, 4 high. Tokens: patches / 4.
GRIDS = {11: [1, 8, 8], 12: [1, 6, 10], 13: [1, 6, 10], 14: [1, 6, 10], 15: [1, 10, 6], 16: [1, 6, 10],
         17: [1, 6, 10], 18: [1, 6, 10], 19: [1, 8, 8], 20: [1, 4, 12]}  # fmt: skip


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return save_tiny_vl_model(tmp_path_factory.mktemp("tiny_vl"))


def _folders() -> list[Path]:
    here = sorted(p for p in DATA.iterdir() if (p / "data.json").is_file())
    shared = sorted(p for p in SHARED.iterdir() if (p / "data.json").is_file()) if SHARED.is_dir() else []
    return shared or here


def test_collector_on_real_geometry3k_rows(tiny: Any) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny.tokenizer)
    model = load_causal_lm(ModelConfig(path=str(tiny.model)), str(tiny.model), torch.device("cpu")).eval()
    rows = [to_row(folder, "train") for folder in _folders()]
    engine = HFEngine(model, tokenizer)
    try:
        sampling = SamplingParams(n=2, max_tokens=3, temperature=1.0, seed=0)
        trajectories = vision_collector(tokenizer, BUDGET)(engine)(rows, sampling, "s1r1")
    finally:
        engine.close()
    pad = VisionTokenIds.from_tokenizer(tokenizer).image_pad
    assert len(trajectories) == 2 * len(rows)
    for i, row in enumerate(rows):
        grid = GRIDS[row["extra_info"]["id"]]
        for traj in trajectories[2 * i : 2 * i + 2]:
            assert traj.group_id == f"s1r1-{i}" and traj.ground_truth == row["reward_model"]["ground_truth"]
            assert traj.multimodal is not None and traj.multimodal["image_grid_thw"].tolist() == [grid]
            assert sum(1 for t in traj.prompt_ids if t == pad) == grid[1] * grid[2] // 4
            assert traj.multimodal["position_ids"].shape == (3, len(traj.prompt_ids))


def test_train_two_grpo_steps_on_a_tiny_vlm(tiny: Any, tmp_path: Path) -> None:
    rows = tmp_path / "rows.jsonl"
    main(["prepare-data", "--input", str(DATA), "--out", str(rows)])
    out = tmp_path / "run"
    overrides = [
        f"model.path={tiny.model}",
        f"model.tokenizer_path={tiny.tokenizer}",
        "model.dtype=float32",
        "model.gradient_checkpointing=false",
        "data.train_batch_size=2",
        "data.drop_last=false",
        "rollout.n=2",
        "rollout.max_tokens=8",
        "actor.mini_batch_size=2",
        "actor.lr=1e-3",
        "algorithm.entropy_coef=0.01",  # a random model earns no reward: the entropy bonus makes step 1 move weights
        "vision.min_pixels=3136",
        "vision.max_pixels=12544",
        "vision.max_prompt_tokens=1024",
        "trainer.total_steps=2",
        "trainer.val_every=0",
        "trainer.val_before_train=false",
        "trainer.device=cpu",
        "trainer.trackers=[jsonl]",
        f"trainer.output_dir={out}",
    ]
    main(["train", "--config", "grpo", "--train-data", str(rows), "--score-workers", "1", *overrides])
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2]
    for step in metrics:
        # engine (prefill + cached decode) and actor (one teacher-forced forward) on the same image prompts
        assert step["mismatch/mismatch_abs_logprob_diff_max"] < 1e-4
        assert {"reward_components/accuracy", "reward_components/format"} <= set(step)
        assert step.get("reward/error_frac", 0.0) == 0.0
        assert step["prompt_length/mean"] > 200  # the image tokens and the EasyR1 instruction are in the prompt
    assert metrics[0]["actor/grad_norm"] > 0  # step 2's rollouts and log-probs come from updated weights
    saved = out / "checkpoints" / "step_2"
    reloaded = load_causal_lm(ModelConfig(path=str(tiny.model)), str(saved), torch.device("cpu"))
    assert type(reloaded).__name__ == "Qwen2_5_VLForConditionalGeneration"


def test_config_is_easyr1s_geometry3k_setup() -> None:
    config, vision = load_config("grpo", [])
    assert (config.data.train_batch_size, config.rollout.n, config.actor.lr) == (512, 5, 1e-6)
    assert (config.algorithm.kl.loss_type, config.algorithm.kl.loss_coef) == ("low_var_kl", 0.01)
    assert (config.rollout.temperature, config.rollout.val_temperature, config.trainer.total_epochs) == (1.0, 0.6, 15)
    assert (vision.min_pixels, vision.max_pixels, vision.max_prompt_tokens) == (512**2, 2048**2, 2048)
    assert "EasyR1:examples/config.yaml" in config_file("grpo").read_text().splitlines()[0]


def test_config_errors_are_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="vision.max_pixelz"):
        load_config("grpo", ["vision.max_pixelz=10"])
    with pytest.raises(ConfigError, match="exceeds max_pixels"):
        load_config("grpo", ["vision.max_pixels=1000"])
    rows = tmp_path / "rows.jsonl"
    rows.write_text("{}\n")
    with pytest.raises(SystemExit):  # model.path left at SET_ME
        main(["train", "--config", "grpo", "--train-data", str(rows)])
