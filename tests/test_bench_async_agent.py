"""The pieces of bench/async_agent_vllm.py that decide its figures, against hand-computed values: the reward of a
response sampled past EOS reads only up to the first EOS, and reward against samples trained (window means of a
step function of cumulative samples, the noise verdict against sync's seed range); and which modes it runs."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import pytest

from rlloom.core_rl import char_tokenizer
from rlloom.core_rl.contracts import Trajectory

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from _long_tail import TailLengths, cut_at_eos, eos_cut_reward
from _reward_curves import VersionedRewards, compare, sampled_steps, table, window_mean, windows


def test_cut_at_eos_keeps_the_tokens_before_the_first_eos() -> None:
    assert cut_at_eos([5, 6, 2, 7, 2, 8], {2}) == [5, 6]
    assert cut_at_eos([2, 5], {2}) == []
    assert cut_at_eos([5, 6, 7], {2}) == [5, 6, 7]  # no EOS: all of it
    assert cut_at_eos([5, 9, 6, 2], {2, 9}) == [5]  # any of several EOS ids
    assert cut_at_eos([], {2}) == []


def test_the_reversal_rubric_scores_the_answer_before_eos_not_the_tail() -> None:
    from rlloom_apps.reasoning.demo import rubric_reward

    tok = char_tokenizer()
    eos = int(tok.eos_token_id)
    ids = lambda text: tok(text, add_special_tokens=False)["input_ids"]  # noqa: E731

    def traj(response: list[int]) -> Trajectory:
        text = tok.decode(response, skip_special_tokens=True)  # what vLLM's text holds: the tail as well
        return Trajectory([1], response, [1] * len(response), ground_truth="284", response_text=text)

    right_then_tail = traj([*ids("284"), eos, *ids("99")])  # text "28499": the rubric alone scores it 0.5 * 3/5
    wrong_then_right = traj([*ids("123"), eos, *ids("284")])
    two_of_three = traj([*ids("281"), eos])
    no_eos = traj(ids("284"))
    trajectories = [right_then_tail, wrong_then_right, two_of_three, no_eos]
    assert [o.score for o in rubric_reward([right_then_tail])] == [pytest.approx(0.3)]
    scores = [o.score for o in eos_cut_reward(rubric_reward, tok)(trajectories)]
    # 0.5 * exact + 0.5 * digits in place: "284" 1.0; "123" vs "284" no digit in place 0.0; "281" 0.5 * 2/3
    assert scores == pytest.approx([1.0, 0.0, 1 / 3, 1.0])
    assert right_then_tail.response_text == "28499"  # the trajectories themselves are left as sampled


def test_tail_lengths_are_seeded_per_context_and_occurrence() -> None:
    a, b = TailLengths(seed=0, median=12, cap=64), TailLengths(seed=0, median=12, cap=64)
    first = [a.draw([1, 2, 3]) for _ in range(20)]
    assert first == [b.draw([1, 2, 3]) for _ in range(20)]  # same seed, context and occurrences: same lengths
    assert len(set(first)) > 1 and all(1 <= n <= 64 for n in first)  # each occurrence its own draw, capped
    capped = TailLengths(seed=0, median=1000, cap=5)
    assert {capped.draw([4]) for _ in range(10)} == {5}


def test_window_mean_weighs_each_step_by_the_samples_it_trained() -> None:
    steps = [(10.0, 0.1), (30.0, 0.5), (0.0, 0.9), (20.0, 0.2)]  # cumulative 10, 40, 40 (skipped), 60
    assert window_mean(steps, 0, 10) == pytest.approx(0.1)
    assert window_mean(steps, 0, 40) == pytest.approx((10 * 0.1 + 30 * 0.5) / 40)
    assert window_mean(steps, 5, 15) == pytest.approx((5 * 0.1 + 5 * 0.5) / 10)  # straddles a step's edge
    assert window_mean(steps, 30, 60) == pytest.approx((10 * 0.5 + 20 * 0.2) / 30)  # the skipped step weighs 0
    with pytest.raises(ValueError, match="runs past the run's 60 trained samples"):
        window_mean(steps, 50, 70)
    assert windows([60, 80, 100], parts=4) == [(0, 15), (15, 30), (30, 45), (45, 60)]


def test_compare_pairs_seeds_and_judges_noise_by_syncs_seed_range() -> None:
    flat = lambda *rewards: [[(8.0, r)] for r in rewards]  # noqa: E731  one step of 8 samples per seed
    runs = {"sync": flat(0.2, 0.4, 0.3), "near": flat(0.35, 0.45, 0.1), "far": flat(0.9, 0.8, 0.85)}
    result = compare(runs, parts=2)
    assert result["windows"] == [(0, 4), (4, 8)]
    near, far = result["modes"]["near"], result["modes"]["far"]
    cell = near["windows"][0]
    # medians 0.35 vs 0.3: gap 0.05 <= sync's range 0.4 - 0.2 = 0.2
    assert (cell["gap"], cell["noise"]) == (pytest.approx(0.05), pytest.approx(0.2))
    # per seed: 0.35 - 0.2, 0.45 - 0.4, 0.1 - 0.3
    assert cell["minus_peer"] == pytest.approx({"median": 0.05, "min": -0.2, "max": 0.15})
    assert near["within_noise"] is True and far["within_noise"] is False  # far: gap 0.55 > 0.2
    assert result["modes"]["sync"]["within_noise"] is None
    lines = table(result)
    assert "near within noise of sync at every window (reward): yes" in lines
    assert "far within noise of sync at every window (reward): no" in lines
    one_seed = compare({"sync": flat(0.2), "near": flat(0.3)}, parts=1)
    assert one_seed["modes"]["near"]["within_noise"] is None  # one seed: no range, nothing judged


def test_sampled_reward_goes_to_the_steps_that_updated_each_policy() -> None:
    from rlloom.core_rl.contracts import RewardOutput

    def traj(versions: list[int], score: float) -> Trajectory:
        return Trajectory([1], [7] * len(versions), [1] * len(versions), policy_versions=versions, ground_truth=score)

    recorder = VersionedRewards(lambda ts: [RewardOutput(score=t.ground_truth) for t in ts])
    # version 0 samples 0.0 and 1.0; a sample started under 1 and finished under 2 counts for 1
    recorder([traj([0, 0], 0.0), traj([0], 1.0), traj([1, 2], 0.25), traj([3], 0.75)])
    assert recorder.means() == {0: 0.5, 1: 0.25, 3: 0.75}
    # step 2 skipped its update (0 samples): step 3 still updates policy 1; step 4 updates policy 3; step 5
    # updates policy 4, which sampled nothing: the nearest earlier version (3) stands in
    steps = sampled_steps([8, 0, 8, 8, 8], recorder.means())
    assert steps == [(8, 0.5), (0, 0.25), (8, 0.25), (8, 0.75), (8, 0.75)]


@pytest.mark.parametrize("task", ["search", "reasoning"])
def test_every_mode_runs_with_dynamic_sampling_and_the_correction(task: str) -> None:
    """`--modes sync,one_step_off,async2,async4 --dynamic-sampling 4 --correction decoupled` skips no mode: each
    demo config loads with every mode's overrides (one-step-off used to refuse dynamic sampling)."""
    from async_agent_vllm import MODE_IDS, Setup, mode_overrides, refusal

    if task == "search":
        from rlloom_apps.search_agent.demo import DEMO_CONFIG
    else:
        from rlloom_apps.reasoning.demo import DEMO_CONFIG

    def no_parts(engine: Any, seed: int) -> Any:
        raise AssertionError("refusal() only loads the config; it builds no run")

    setup = Setup(DEMO_CONFIG, Path("model"), Path("tokenizer"), parts=no_parts)
    args = argparse.Namespace(dynamic_sampling=4, correction="decoupled")
    assert {name: refusal(setup, args, name) for name in MODE_IDS.values()} == dict.fromkeys(MODE_IDS.values())
    assert "algorithm.dynamic_sampling.max_rounds=4" in mode_overrides(args, "one_step_off")
    assert "algorithm.off_policy_correction.method=decoupled" in mode_overrides(args, "one_step_off")
