"""AgentRubric: outcome, format and tool-use terms, reported whatever happens to the outcome scorer."""

from __future__ import annotations

from typing import Any

import pytest

from rlloom.agent.rewards import AgentRubric, EpisodeSummary

EPISODE = EpisodeSummary(
    model_text="<answer>5</answer>",
    ground_truth="5",
    extra_info={},
    turns_well_formed=3,
    turns=4,
    tool_calls=4,
    tool_errors=1,
)


def test_all_components_are_reported() -> None:
    out = AgentRubric(lambda r, g, extra_info=None: 1.0, format_weight=0.5, tool_use_weight=0.2).score(EPISODE)
    assert out.components == {"outcome": 1.0, "format": 0.75, "tool_use": 0.75}
    assert out.score == pytest.approx(1.0 + 0.5 * 0.75 + 0.2 * 0.75)


def test_a_crashing_outcome_still_reports_format_and_tool_use() -> None:
    def broken(response: str, ground_truth: Any, *, extra_info: Any = None) -> float:
        raise RuntimeError("scorer broke")

    out = AgentRubric(broken, format_weight=0.5, tool_use_weight=0.2).score(EPISODE)
    assert out.components == {"outcome": 0.0, "format": 0.75, "tool_use": 0.75}
    assert out.score == 0.0  # format and tool use are not rewarded on their own
    assert out.error == "RuntimeError: scorer broke"


def test_a_slow_outcome_scorer_does_not_stall_the_other_conversations(tokenizer: Any, replay_engine: Any) -> None:
    """A scorer that runs for a while (code tests, a judge) ran on the event loop: every other conversation, its
    tool calls and searches stood still meanwhile. A ticker on the same loop must keep ticking."""
    import asyncio
    import time

    from rlloom.agent.envs.single_turn import SingleTurnEnv
    from rlloom.agent.loop import AgentLoop

    def slow_exact(response: str, ground_truth: Any, *, extra_info: Any = None) -> float:
        time.sleep(0.4)  # blocking, as sandboxed code execution is
        return float(response.strip() == ground_truth)

    engine = replay_engine(tokenizer, lambda context: "5")
    loop = AgentLoop(engine, tokenizer, lambda: SingleTurnEnv(AgentRubric(slow_exact)))

    async def run() -> tuple[list[Any], float]:
        gaps: list[float] = []
        done = asyncio.Event()

        async def ticker() -> None:
            last = time.perf_counter()
            while not done.is_set():
                await asyncio.sleep(0.02)
                now = time.perf_counter()
                gaps.append(now - last)
                last = now

        tick = asyncio.create_task(ticker())
        trajectories = await loop.arun([{"question": "2+3?", "answer": "5"}], n=4)
        done.set()
        await tick
        return trajectories, max(gaps)

    trajectories, longest_gap = asyncio.run(run())
    assert [t.reward for t in trajectories] == [1.0] * 4
    assert longest_gap < 0.3  # a blocked loop misses ticks for 0.4 s per conversation scored


def test_scoring_errors_reach_the_trainer_in_one_place(tokenizer: Any, replay_engine: Any) -> None:
    """A rubric's error and a crashing reward hook both land in `Trajectory.reward_error` (no second copy in
    extra_info, no made-up reward component), and `env_reward` hands that to the trainer."""
    from rlloom.agent.envs.single_turn import SingleTurnEnv
    from rlloom.agent.loop import AgentLoop
    from rlloom.agent.training import env_reward

    def broken(response: str, ground_truth: Any, *, extra_info: Any = None) -> float:
        raise RuntimeError("scorer broke")

    class CrashingEnv(SingleTurnEnv):
        async def reward(self, trajectory: Any) -> Any:
            raise ValueError("hook broke")

    engine = replay_engine(tokenizer, lambda context: "5")
    rubric_error = AgentLoop(engine, tokenizer, lambda: SingleTurnEnv(AgentRubric(broken))).run(
        [{"question": "2+3?", "answer": "5"}], n=1
    )[0]
    hook_error = AgentLoop(engine, tokenizer, lambda: CrashingEnv(AgentRubric(broken))).run(
        [{"question": "2+3?", "answer": "5"}], n=1
    )[0]
    assert rubric_error.reward_error == "RuntimeError: scorer broke"
    assert hook_error.reward_error == "ValueError: hook broke"
    assert hook_error.reward == 0.0 and hook_error.reward_components == {}
    for traj in (rubric_error, hook_error):
        assert "reward_error" not in traj.extra_info and "reward_error" not in traj.reward_components
    assert [out.error for out in env_reward([rubric_error, hook_error])] == [
        "RuntimeError: scorer broke",
        "ValueError: hook broke",
    ]


def test_progress_counts_model_turns_as_they_happen(
    tokenizer: Any, replay_engine: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """The progress bar moves with every model turn, not only when a whole conversation ends (search-agent eval's
    first conversation can take minutes): `rollout(on_turn=...)` is called per turn, and the bar shows the count."""
    import asyncio

    from rlloom.agent.environment import Sample
    from rlloom.agent.envs.single_turn import SingleTurnEnv
    from rlloom.agent.loop import AgentLoop, AgentLoopConfig

    engine = replay_engine(tokenizer, lambda context: "5")
    rubric = AgentRubric(lambda r, g, extra_info=None: 1.0)
    loop = AgentLoop(engine, tokenizer, lambda: SingleTurnEnv(rubric), AgentLoopConfig(progress=True))
    seen: list[int] = []
    sample = Sample.from_row({"question": "2+3?", "answer": "5"})
    traj = asyncio.run(loop.rollout(sample, on_turn=lambda: seen.append(len(seen) + 1)))
    assert seen == [1] and traj.metrics["turns"] == 1.0
    loop.run([{"question": "2+3?", "answer": "5"}], n=3)
    assert "3 turns" in capsys.readouterr().err
