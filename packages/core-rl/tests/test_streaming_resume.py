"""trainer.mode=async resume with the finished groups persisted: a checkpoint holds the groups that were finished
but not yet trained, the resume trains exactly those samples and generates only the groups in flight at the save;
a checkpoint written before groups were saved still resumes, generating them again."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import torch
from test_async_rl import ASYNC, ChunkRecordingEngine, distinct_rows, trained_rows, trainer_for

from rlloom.core_rl.run.checkpoint import STATE_FILE, load_trainer_state

STEPS = [*ASYNC, "trainer.total_steps=6", "trainer.streaming.max_staleness=2", "trainer.save_every=1"]
ROWS = 12  # 4 a step: 3 steps an epoch, 6 steps two epochs, 24 groups in all


def records_by_group(dump: Path, first_step: int) -> dict[str, list[tuple[int, str, float]]]:
    """group id → its samples (response tokens, response, reward) trained at `first_step` or later. An empty
    response text is dumped as its tokens' readable text, so compare those by length and reward."""
    out: dict[str, list[tuple[int, str, float]]] = {}
    for path in dump.glob("*.jsonl"):
        if int(path.stem) < first_step:
            continue
        for record in map(json.loads, path.read_text().splitlines()):
            sample = (record["response_tokens"], record["response"], round(record["reward"], 6))
            out.setdefault(record["group_id"], []).append(sample)
    return out


def same_samples(dumped: list[tuple[int, str, float]], saved: list[dict[str, Any]]) -> bool:
    """The dumped samples are the saved trajectories: equal lengths, rewards and texts (a dumped text that is no
    saved one stands for an empty saved text, dumped as its tokens' readable text)."""
    texts = {t["response_text"] for t in saved}
    got = sorted((n, text if text in texts else "", reward) for n, text, reward in dumped)
    want = sorted((len(t["response_ids"]), t["response_text"], round(t["reward"], 6)) for t in saved)
    return got == want


def first_part_rows(dump: Path, last_step: int) -> Counter[str]:
    rows: Counter[str] = Counter()
    for step in range(1, last_step + 1):
        records = [json.loads(line) for line in (dump / f"{step}.jsonl").read_text().splitlines()]
        rows.update({p: c // 4 for p, c in Counter(r["prompt"] for r in records).items()})
    return rows


def run(model_dir: Path, out: Path, extra: list[str], engine: Any = None) -> list[dict[str, Any]]:
    overrides = [*STEPS, "trainer.keep_last=6", f"trainer.rollout_data_dir={out}/dump", *extra]
    trainer_for(model_dir, out, overrides, engine=engine, train_data=distinct_rows(ROWS)).fit()
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_a_resume_trains_the_saved_groups_and_generates_only_those_in_flight(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    whole = tmp_path / "whole"
    run(tiny_model_dir, whole, [])
    saved = load_trainer_state(whole / "checkpoints" / "step_2")["loader"]
    finished = saved["finished"]
    # eta 2 admits 20 groups before step 2's update ends; the fast tiny engine finishes some of them untrained
    assert finished, "no finished group was waiting at the step-2 save"
    for group in finished:
        for traj in group["trajectories"]:
            assert len(traj["rollout_logprobs"]) == len(traj["policy_versions"]) == len(traj["response_ids"])
            assert traj["reward"] is not None

    engine = ChunkRecordingEngine(tiny_model_dir)  # notes one entry per request: one request per group
    resumed = tmp_path / "resumed"
    lines = run(tiny_model_dir, resumed, [f"trainer.resume={whole}/checkpoints/step_2"], engine=engine)
    # 24 groups in the run, 8 trained by step 2, the saved ones restored: the rest, and only they, are generated
    assert len(engine.max_tokens) == 2 * ROWS - 8 - len(finished)
    assert lines[0]["async/groups_restored"] == len(finished)
    # the same rows as the uninterrupted run, none lost, none twice
    assert first_part_rows(whole / "dump", 2) + trained_rows(resumed / "dump") == trained_rows(whole / "dump")
    # and the restored groups are the very samples the uninterrupted run trained after step 2
    after_whole, after_resumed = records_by_group(whole / "dump", 3), records_by_group(resumed / "dump", 3)
    for group in finished:
        (group_id,) = {t["group_id"] for t in group["trajectories"]}
        for dump in (after_whole, after_resumed):
            assert same_samples(dump[group_id], group["trajectories"]), (dump[group_id], group["trajectories"])


def test_a_checkpoint_without_saved_groups_still_resumes_generating_them(tiny_model_dir: Path, tmp_path: Path) -> None:
    whole = tmp_path / "whole"
    run(tiny_model_dir, whole, [])
    old = tmp_path / "old_step_2"
    shutil.copytree(whole / "checkpoints" / "step_2", old)
    state = load_trainer_state(old)
    state["loader"].pop("finished")  # as the trainer wrote it before finished groups were saved
    torch.save(state, old / STATE_FILE)

    engine = ChunkRecordingEngine(tiny_model_dir)
    resumed = tmp_path / "resumed"
    lines = run(tiny_model_dir, resumed, [f"trainer.resume={old}"], engine=engine)
    assert len(engine.max_tokens) == 2 * ROWS - 8  # every untrained group generated again
    assert lines[0]["async/groups_restored"] == 0.0
    assert first_part_rows(whole / "dump", 2) + trained_rows(resumed / "dump") == trained_rows(whole / "dump")
