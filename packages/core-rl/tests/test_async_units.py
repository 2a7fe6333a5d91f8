"""The parts of trainer.mode=async against hand-computed values: AReaL's admission rule, the group buffer's
oldest-first take and its wait for late groups, the update gate, staleness metrics, the decoupled-PPO and TIS
weights and loss, per-token versions in the batch, and the config's keys and refusals."""

from __future__ import annotations

import math
import threading
import time

import pytest
import torch

from rlloom.core_rl.algorithms import off_policy_weights, ppo_policy_loss
from rlloom.core_rl.config.loading import load_config
from rlloom.core_rl.config.schema import ConfigError
from rlloom.core_rl.contracts.batch import TrajectoryBatch
from rlloom.core_rl.contracts.trajectory import Trajectory
from rlloom.core_rl.streaming.buffer import GeneratorError, Group, GroupBuffer, admits
from rlloom.core_rl.streaming.gate import UpdateGate
from rlloom.core_rl.streaming.staleness import staleness_metrics


def traj(versions: list[int], mask: list[int] | None = None) -> Trajectory:
    n = len(versions)
    return Trajectory(
        prompt_ids=[1, 2], response_ids=[3] * n, loss_mask=mask or [1] * n, policy_versions=versions, group_id="g"
    )


def test_admission_follows_arealls_rule() -> None:
    # eta=0, batch 4: version 0 admits groups 0-3, the fifth waits for version 1
    assert [admits(s, 0, max_staleness=0, batch_size=4) for s in (0, 3, 4)] == [True, True, False]
    assert admits(4, 1, max_staleness=0, batch_size=4)
    # eta=2: (0 + 2 + 1) x 4 = 12 groups may start before the first update
    assert admits(11, 0, max_staleness=2, batch_size=4) and not admits(12, 0, max_staleness=2, batch_size=4)


def test_the_buffer_gives_the_oldest_version_first_in_admission_order() -> None:
    buffer = GroupBuffer()
    groups = [Group(i, 1, i, i, version) for i, version in enumerate([1, 0, 1, 0, 2])]
    for g in groups:
        buffer.started(g)
    for g in reversed(groups):
        buffer.finished(g)
    taken, ready = buffer.take(3, oldest_version=0)
    assert ready == 5
    assert [g.index for g in taken] == [0, 1, 3]  # versions 0, 0 and the older of the two 1s, in admission order
    assert buffer.counts() == (2, 0)


def test_the_buffer_waits_for_a_group_that_would_grow_too_stale() -> None:
    buffer = GroupBuffer()
    slow, fast = Group(0, 1, 0, 0, 0), [Group(i, 1, i, i, 1) for i in (1, 2)]
    for g in [slow, *fast]:
        buffer.started(g)
    for g in fast:
        buffer.finished(g)
    with pytest.raises(TimeoutError):  # two finished groups are enough, but version 0's group is still running
        buffer.take(2, oldest_version=1, timeout=0.2)
    threading.Timer(0.2, buffer.finished, args=(slow,)).start()
    taken, _ = buffer.take(2, oldest_version=1, timeout=10)
    assert [g.index for g in taken] == [0, 1]  # the slow group is trained now, not dropped
    buffer.failed(ValueError("boom"))
    with pytest.raises(GeneratorError, match="boom"):
        buffer.take(1, oldest_version=0, timeout=1)


def test_the_buffer_takes_old_groups_early_enough_for_the_next_steps() -> None:
    """Batch 2: four groups of version 0 (one finished, three running) and two finished of version 1. Taking
    [v0, v1] now would leave three version-0 groups due by the next step, which only holds two: the take waits
    until two version-0 groups are finished and trains both (earliest deadline first)."""
    buffer = GroupBuffer()
    old = [Group(i, 1, i, i, 0) for i in range(4)]
    new = [Group(4 + i, 2, i, 4 + i, 1) for i in range(2)]
    for g in [*old, *new]:
        buffer.started(g)
    for g in [old[0], *new]:
        buffer.finished(g)
    with pytest.raises(TimeoutError):  # nothing is due at this step (oldest_version 0), but the next one would be
        buffer.take(2, oldest_version=0, timeout=0.2)
    buffer.finished(old[1])
    taken, _ = buffer.take(2, oldest_version=0, timeout=10)
    assert [g.index for g in taken] == [0, 1]


def test_the_gate_lets_a_push_wait_only_for_readers_in_progress() -> None:
    gate, events = UpdateGate(), []
    reading = threading.Event()

    def reader() -> None:
        with gate.reading():
            reading.set()
            time.sleep(0.3)
            events.append("read done")

    thread = threading.Thread(target=reader)
    thread.start()
    reading.wait()
    with gate.writing():
        events.append("push")
        late = threading.Thread(target=lambda: gate.reading().__enter__() or events.append("late read"))
        late.start()
        time.sleep(0.2)
        events.append("push done")
    late.join()
    thread.join()
    assert events == ["read done", "push", "push done", "late read"]


def test_staleness_metrics_by_hand() -> None:
    batch = [traj([3, 3]), traj([2, 3]), traj([1, 1, 1]), traj([0, 3], mask=[0, 1])]
    m = staleness_metrics(batch, trainer_version=3)
    # lags: 0, 1, 2, and 0 (the masked token's version 0 is no sampled token)
    assert m["async/staleness_mean"] == pytest.approx(0.75)
    assert m["async/staleness_max"] == 2.0
    assert m["async/staleness_p50"] == 0.5
    assert m["async/version_spread"] == 2.0  # tokens of versions 1..3
    assert m["async/multi_version_frac"] == 0.25
    assert (m["async/staleness_count/0"], m["async/staleness_count/1"], m["async/staleness_count/2"]) == (2, 1, 1)


def test_decoupled_ppo_and_tis_weights_and_loss_by_hand() -> None:
    prox = torch.log(torch.tensor([[0.5, 0.2, 0.9]]))
    behav = torch.log(torch.tensor([[0.25, 0.2, 0.1]]))
    mask = torch.ones(1, 3)
    decoupled = off_policy_weights(prox, behav, mask, method="decoupled", cap=5.0)
    tis = off_policy_weights(prox, behav, mask, method="tis", cap=5.0)
    assert decoupled[0].tolist() == pytest.approx([2.0, 1.0, 0.0])  # 9 > cap: the token drops out (AReaL)
    assert tis[0].tolist() == pytest.approx([2.0, 1.0, 5.0])  # truncated at the cap (Yao et al.)
    # AReaL's objective: ratio against the proximal policy, clipped, times pi_prox/pi_behav
    logprobs = torch.log(torch.tensor([[0.6, 0.2, 0.9]]))
    advantages = torch.tensor([[1.0, -1.0, 1.0]])
    loss, _ = ppo_policy_loss(
        logprobs, prox, advantages, mask, clip_low=0.2, clip_high=0.28, rollout_is_weights=decoupled
    )
    # ratios 1.2, 1.0, 1.0 all inside [0.8, 1.28]: (-1.2 x 2 + 1.0 x 1 - 1.0 x 0) / 3 tokens
    assert float(loss) == pytest.approx((-2.4 + 1.0 + 0.0) / 3)
    with pytest.raises(ValueError, match="unknown off-policy correction"):
        off_policy_weights(prox, behav, mask, method="ppo", cap=1.0)


def test_the_batch_carries_per_token_versions_when_every_trajectory_has_them() -> None:
    batch = TrajectoryBatch.from_trajectories([traj([4, 5]), traj([5, 5, 6])], pad_token_id=0)
    assert batch["policy_versions"].tolist() == [[4, 5, 0], [5, 5, 6]]
    plain = Trajectory(prompt_ids=[1], response_ids=[2], loss_mask=[1])
    assert "policy_versions" not in TrajectoryBatch.from_trajectories([traj([1]), plain], pad_token_id=0)


def test_trainer_mode_keys_and_refusals() -> None:
    base = ["model.path=/m"]
    cfg = load_config(None, [*base, "trainer.one_step_off_policy=true"])
    assert cfg.trainer.mode == "one_step_off"  # the old switch, read as the new key with a hint
    cfg = load_config(None, [*base, "trainer.mode=async", "trainer.streaming.max_staleness=4"])
    assert cfg.trainer.streaming is not None and cfg.trainer.streaming.max_staleness == 4
    off = load_config(None, [*base, "trainer.mode=async", "trainer.streaming.partial_rollout=off"]).trainer.streaming
    assert off is not None and off.partial_rollout == "off"  # YAML's bare off (a boolean) read as the word
    refusals = {
        "trainer.streaming: is set but trainer.mode=sync": ["trainer.streaming.max_staleness=2"],
        "trainer.streaming.max_staleness: is 0 with algorithm.dynamic_sampling": [
            "trainer.mode=async",
            "trainer.streaming.max_staleness=0",
            "algorithm.dynamic_sampling=true",
        ],
        "trainer.one_step_off_policy: cannot run with data.filter_solved": [
            "trainer.mode=one_step_off",
            "data.filter_solved=true",
        ],
        "trainer.mode: async cannot run with data.filter_solved": ["trainer.mode=async", "data.filter_solved=true"],
        "algorithm.off_policy_correction: method=tis and algorithm.tis": [
            "algorithm.off_policy_correction.method=tis",
            "algorithm.tis.cap=2",
        ],
        "trainer.one_step_off_policy: true but trainer.mode=async": [
            "trainer.mode=async",
            "trainer.one_step_off_policy=true",
        ],
    }
    dynamic = load_config(None, [*base, "trainer.mode=async", "algorithm.dynamic_sampling.max_rounds=4"])
    assert dynamic.algorithm.dynamic_sampling is not None  # async filters each group as it finishes (eta >= 1)
    # one-step-off runs sync's rounds on its rollout worker
    dynamic = load_config(None, [*base, "trainer.mode=one_step_off", "algorithm.dynamic_sampling.max_rounds=4"])
    assert dynamic.algorithm.dynamic_sampling is not None
    for message, overrides in refusals.items():
        with pytest.raises(ConfigError, match=message.replace(".", r"\.")):
            load_config(None, [*base, *overrides])
    with pytest.raises(ConfigError, match="trainer.streaming.max_staleness"):
        load_config(None, [*base, "trainer.mode=async", "trainer.streaming.max_staleness=-1"])
    correction = load_config(None, [*base, "algorithm.off_policy_correction={}"]).algorithm.off_policy_correction
    assert correction is not None and math.isclose(correction.cap, 5.0)  # AReaL's behav_imp_weight_cap


def test_reprefill_chunks_end_at_a_stop_string_that_straddles_two_chunks() -> None:
    """Each chunk's request sees only its own text, so a stop string split by a chunk boundary must be found in the
    stitched text: the chunked sample then ends as the unchunked engine's does (reference: one greedy request)."""
    hf = pytest.importorskip("rlloom.rollout.hf.engine")
    from rlloom.core_rl.contracts.generation import GenerationRequest, SamplingParams
    from rlloom.core_rl.streaming.chunked import chunked_collector
    from rlloom.core_rl.tiny import char_tokenizer, move_from_start, tiny_qwen2

    tok = char_tokenizer()
    model = move_from_start(tiny_qwen2(tok, seed=0), seed=6)  # so the greedy text varies
    engine = hf.HFEngine(model, tok)
    try:
        prompt = list(tok("3+4=", add_special_tokens=False)["input_ids"])
        greedy = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
        [[free]] = engine.generate([GenerationRequest(prompt_ids=prompt, sampling=greedy)])
        pieces = [tok.decode([t], skip_special_tokens=True) for t in free.token_ids]
        text = "".join(pieces)

        def straddles(i: int) -> bool:  # the characters of tokens i-1 and i first occur together there
            pair = pieces[i - 1] + pieces[i]
            return len(pair) == 2 and text.find(pair) == len("".join(pieces[: i - 1]))

        cut = next(i for i in range(2, 15) if straddles(i))  # the first chunk holds `cut` tokens
        stopping = greedy.model_copy(update={"stop": [pieces[cut - 1] + pieces[cut]]})
        [[reference]] = engine.generate([GenerationRequest(prompt_ids=prompt, sampling=stopping)])
        assert reference.finish_reason == "stop" and len(reference.token_ids) == cut + 1
        collect = chunked_collector(engine, engine.generate, UpdateGate(), lambda: 0, chunk_tokens=cut)
        [chunked] = collect([{"prompt_ids": prompt}], stopping, "t")
    finally:
        engine.close()
    assert chunked.response_ids == reference.token_ids
    assert chunked.response_text == reference.text
    assert chunked.finish_reason == "stop"
