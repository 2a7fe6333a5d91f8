"""trainer.mode=async end to end on the tiny model: max_staleness=0 reproduces the synchronous trainer, the
staleness bound holds, a resume neither loses nor repeats a group, partial rollouts by re-prefill, and a failed
weight push stops the run naming its step."""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from tiny_run import SamplingEngine, digit_reward, sum_rows, tiny_config

from rlloom.core_rl.config.schema import ConfigError
from rlloom.core_rl.contracts.generation import GenerationRequest
from rlloom.core_rl.contracts.trajectory import Trajectory
from rlloom.core_rl.run.checkpoint import load_trainer_state
from rlloom.core_rl.trainer import Trainer

ASYNC = ["trainer.mode=async", "actor.warmup_steps=0", "trainer.save_every=0"]
SKIPPED_PREFIXES = ("timing/", "perf/", "async/", "rollout/policy_lag")


def metric_lines(run: Path) -> list[dict[str, float]]:
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [line for line in lines if "reward/mean" in line]


class RowRecordingReward:
    """The digit reward, noting every row (by its prompt) it scored, per call."""

    def __init__(self) -> None:
        self.prompts: list[str] = []

    def __call__(self, trajectories: Sequence[Trajectory]) -> Any:
        self.prompts += [str(t.prompt_messages) for t in trajectories]
        return digit_reward(trajectories)


def trainer_for(model_dir: Path, out: Path, overrides: list[str], engine: Any = None, **kwargs: Any) -> Trainer:
    return Trainer(
        tiny_config(model_dir, out, overrides),
        engine=engine if engine is not None else SamplingEngine(model_dir),
        reward_fn=kwargs.pop("reward_fn", digit_reward),
        train_data=kwargs.pop("train_data", sum_rows(8)),
        **kwargs,
    )


def test_max_staleness_zero_gives_the_synchronous_metrics(tiny_model_dir: Path, tmp_path: Path) -> None:
    steps = ["trainer.total_steps=2", "actor.warmup_steps=0", "trainer.save_every=0"]
    trainer_for(tiny_model_dir, tmp_path / "sync", steps).fit()
    trainer_for(
        tiny_model_dir, tmp_path / "async", [*steps, "trainer.mode=async", "trainer.streaming.max_staleness=0"]
    ).fit()
    sync, asynchronous = metric_lines(tmp_path / "sync"), metric_lines(tmp_path / "async")
    assert len(sync) == len(asynchronous) == 2
    compared = 0
    for expected, got in zip(sync, asynchronous, strict=True):
        for key, value in expected.items():
            if key.startswith(SKIPPED_PREFIXES):
                continue
            assert key in got, key
            assert math.isclose(got[key], value, rel_tol=1e-6, abs_tol=1e-7), (key, value, got[key])
            compared += 1
        assert got["async/staleness_max"] == 0.0
    assert compared > 60  # rewards, losses, KL, entropy, grad norms, lengths ...


def test_staleness_stays_within_the_bound_and_every_row_trains_once_per_epoch(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    reward = RowRecordingReward()
    trainer = trainer_for(
        tiny_model_dir,
        tmp_path / "run",
        [
            *ASYNC,
            "trainer.total_steps=4",
            "trainer.streaming.max_staleness=1",
            "trainer.streaming.max_groups_in_flight=3",
        ],
        reward_fn=reward,
        train_data=distinct_rows(8),
    )
    trainer.fit()
    lines = metric_lines(tmp_path / "run")
    assert len(lines) == 4
    assert max(line["async/staleness_max"] for line in lines) <= 1.0
    # with eta=1 the generator runs ahead: some batch is sampled one update behind
    assert any(line["async/staleness_max"] == 1.0 for line in lines)
    for line in lines:
        counted = sum(v for k, v in line.items() if k.startswith("async/staleness_count/"))
        assert counted == 16  # 4 groups x 4 samples
        assert line["async/groups_in_flight"] <= 3
    # 16 groups generated for 16 trained (2 epochs of 8 rows), each row's 4 samples scored once an epoch
    assert sorted(Counter(reward.prompts).values()) == [8] * 8


def trained_rows(dump: Path) -> Counter[str]:
    rows: Counter[str] = Counter()
    for path in sorted(dump.glob("*.jsonl")):
        groups = {}
        for record in map(json.loads, path.read_text().splitlines()):
            groups.setdefault(record["prompt"], 0)
            groups[record["prompt"]] += 1
        rows.update({prompt: count // 4 for prompt, count in groups.items()})
    return rows


def distinct_rows(count: int) -> list[dict[str, Any]]:
    """Rows with distinct prompts, so a dump's prompt names its row."""
    rows: dict[str, dict[str, Any]] = {}
    for row in sum_rows(100, seed=3):
        rows.setdefault(row["prompt"][0]["content"], row)
    return list(rows.values())[:count]


def test_a_resume_mid_run_neither_loses_nor_repeats_a_group(tiny_model_dir: Path, tmp_path: Path) -> None:
    data = distinct_rows(12)  # 4 per step: 3 steps an epoch, 6 steps two epochs
    steps = [
        *ASYNC,
        "trainer.total_steps=6",
        "trainer.streaming.max_staleness=2",
        "trainer.save_every=1",
        "trainer.keep_last=6",
    ]
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    trainer_for(tiny_model_dir, whole, [*steps, f"trainer.rollout_data_dir={whole}/dump"], train_data=data).fit()
    trainer_for(
        tiny_model_dir,
        resumed,
        [*steps, f"trainer.rollout_data_dir={resumed}/dump", f"trainer.resume={whole}/checkpoints/step_2"],
        train_data=data,
    ).fit()
    saved = load_trainer_state(whole / "checkpoints" / "step_2")["loader"]
    assert saved["async_draw"] <= 3  # resumes at or before the first draw not fully trained by step 2
    uninterrupted = trained_rows(whole / "dump")
    assert sorted(uninterrupted.values()) == [2] * 12  # every row twice in two epochs
    # steps 1-2 of the first run, then 3-6 of the resumed one
    first_part = Counter[str]()
    for step in (1, 2):
        records = [json.loads(line) for line in (whole / "dump" / f"{step}.jsonl").read_text().splitlines()]
        first_part.update({p: c // 4 for p, c in Counter(r["prompt"] for r in records).items()})
    combined = first_part + trained_rows(resumed / "dump")
    assert combined == uninterrupted


class ChunkRecordingEngine(SamplingEngine):
    """Notes every request's prompt length and max_tokens; fails its push at a chosen count."""

    def __init__(self, model_dir: Path, fail_at_push: int | None = None) -> None:
        super().__init__(model_dir)
        self.max_tokens: list[int] = []
        self.fail_at_push = fail_at_push

    def generate(self, requests: Sequence[GenerationRequest]) -> Any:
        self.max_tokens += [r.sampling.max_tokens for r in requests]
        return super().generate(requests)

    def update_weights(self, named_tensors: Mapping[str, torch.Tensor]) -> None:
        if self.fail_at_push is not None and self.weight_updates + 1 >= self.fail_at_push:
            raise ConnectionError("engine went away")
        super().update_weights(named_tensors)


def test_partial_rollouts_by_reprefill_generate_in_chunks(tiny_model_dir: Path, tmp_path: Path) -> None:
    engine = ChunkRecordingEngine(tiny_model_dir)
    overrides = [
        *ASYNC,
        "trainer.total_steps=3",
        "trainer.streaming.max_staleness=1",
        "trainer.streaming.partial_rollout=reprefill",
        "trainer.streaming.chunk_tokens=5",
        "algorithm.off_policy_correction.method=decoupled",
        "rollout.max_tokens=12",
    ]
    trainer_for(tiny_model_dir, tmp_path / "run", overrides, engine=engine).fit()
    assert max(engine.max_tokens) == 5  # no request asked for more than one chunk
    assert 2 in engine.max_tokens  # the last chunk of a 12-token response: 5 + 5 + 2
    lines = metric_lines(tmp_path / "run")
    assert len(lines) == 3
    assert all(line["async/staleness_max"] <= 1.0 for line in lines)
    assert all(line["response_length/max"] <= 12 for line in lines)


def test_a_failed_weight_push_stops_the_run_naming_the_step(tiny_model_dir: Path, tmp_path: Path) -> None:
    engine = ChunkRecordingEngine(tiny_model_dir, fail_at_push=3)  # fit()'s first sync, step 1's, then step 2's
    trainer = trainer_for(tiny_model_dir, tmp_path / "run", [*ASYNC, "trainer.total_steps=4"], engine=engine)
    with pytest.raises(RuntimeError, match="weight sync of step 2 to the rollout engine failed: engine went away"):
        trainer.fit()


def test_critic_warm_up_steps_still_admit_the_next_groups(tiny_model_dir: Path, tmp_path: Path) -> None:
    """Warm-up steps train only the critic, so the weights' version stands still; admission counts batches taken,
    so the generator keeps going (counting weight versions, step 2 would wait for groups never admitted)."""
    overrides = [
        *ASYNC,
        "trainer.total_steps=3",
        "trainer.streaming.max_staleness=0",
        "algorithm.advantage.estimator=gae",
        "trainer.critic_warmup=2",
    ]
    trainer_for(tiny_model_dir, tmp_path / "run", overrides).fit()
    lines = metric_lines(tmp_path / "run")
    assert [line["actor/critic_warmup"] for line in lines] == [1.0, 1.0, 0.0]
    assert all(line["async/staleness_max"] == 0.0 for line in lines)


@pytest.mark.parametrize(("inflight_kv", "partial_rollout"), [("keep", "off"), ("reprefill", "reprefill")])
def test_on_the_hf_engine_tokens_carry_their_versions_and_the_bound_holds(
    tiny_model_dir: Path, tmp_path: Path, inflight_kv: str, partial_rollout: str
) -> None:
    """HFEngine updates in flight (pause, push, resume with the version) and labels every token: responses span
    versions, and no trained token is more than max_staleness updates old; with inflight_kv=reprefill (what
    partial_rollout=reprefill asks of it) a response that spans a push was re-prefilled."""
    hf = pytest.importorskip("rlloom.rollout.hf.engine")
    engine = hf.HFEngine.from_pretrained(str(tiny_model_dir), config=hf.HFEngineConfig(inflight_kv=inflight_kv))
    # responses long enough (up to 160 tokens) that pushes land inside them
    overrides = [*ASYNC, "trainer.total_steps=5", "trainer.streaming.max_staleness=1", "rollout.max_tokens=160"]
    overrides.append(f"trainer.streaming.partial_rollout={partial_rollout}")
    try:
        trainer_for(tiny_model_dir, tmp_path / "run", overrides, engine=engine).fit()
    finally:
        engine.close()
    lines = metric_lines(tmp_path / "run")
    assert len(lines) == 5
    assert max(line["async/staleness_max"] for line in lines) == 1.0
    assert all(line["async/version_spread"] <= 2.0 for line in lines)
    spanned = any(line["async/multi_version_frac"] > 0 for line in lines)
    assert (engine.decode_stats.reprefilled_tokens > 0) == (spanned and inflight_kv == "reprefill")


def test_partial_rollout_must_agree_with_the_engines_inflight_kv(tiny_model_dir: Path, tmp_path: Path) -> None:
    """An InflightWeightUpdate engine takes every push in flight; keep_kv and reprefill insist on what it does
    with the paused requests' KV cache, and a refusal names the key and the engine's setting to change."""
    hf = pytest.importorskip("rlloom.rollout.hf.engine")
    keeping = hf.HFEngine.from_pretrained(str(tiny_model_dir))
    reprefilling = hf.HFEngine.from_pretrained(str(tiny_model_dir), config=hf.HFEngineConfig(inflight_kv="reprefill"))

    def trainer(partial_rollout: str, engine: Any) -> Trainer:
        overrides = [*ASYNC, "trainer.total_steps=1", f"trainer.streaming.partial_rollout={partial_rollout}"]
        return trainer_for(tiny_model_dir, tmp_path / partial_rollout, overrides, engine=engine)

    try:
        with pytest.raises(ConfigError) as refused:
            trainer("reprefill", keeping)
        message = str(refused.value)
        assert "trainer.streaming.partial_rollout: reprefill" in message and "HFEngine keeps" in message
        assert "inflight_kv" in message and "HFEngineConfig(inflight_kv='reprefill')" in message
        with pytest.raises(ConfigError, match="trainer.streaming.partial_rollout: keep_kv needs an engine that keeps"):
            trainer("keep_kv", reprefilling)
        trainer("reprefill", reprefilling)  # accepted: the engine re-prefills
        trainer("keep_kv", keeping)
        trainer("off", reprefilling)  # off takes the engine's own choice
    finally:
        keeping.close()
        reprefilling.close()
