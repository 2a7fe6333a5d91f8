"""CodeEnv: the `python` tool runs in rlloom-rewards' sandbox; output and tracebacks come back as observations."""

from __future__ import annotations

import json
from typing import Any

from rlloom.agent.envs.code import CodeEnv, python_toolset
from rlloom.agent.loop import AgentLoop, AgentLoopConfig
from rlloom.agent.rewards import AgentRubric


def final_is(response: str, ground_truth: Any, *, extra_info: Any = None) -> float:
    return float(response.strip() == str(ground_truth))


def call(code: str) -> str:
    return "<tool_call>" + json.dumps({"name": "python", "arguments": {"code": code}}) + "</tool_call>"


def test_code_env_runs_code_and_returns_output_and_errors(tokenizer: Any, replay_engine: Any) -> None:
    turns = [
        call("import sys\nprint(6 * 7)\nprint('warn', file=sys.stderr)"),
        call("print('partial')\nraise ValueError('bad input')"),
        "42",
    ]
    sandbox = python_toolset(timeout=10.0, allow_weak_isolation=True)
    engine = replay_engine(tokenizer, lambda ctx: turns[ctx.count("<|im_start|>assistant") - 1])
    rubric = AgentRubric(final_is, tool_use_weight=1.0)
    loop = AgentLoop(engine, tokenizer, lambda: CodeEnv(sandbox, rubric), AgentLoopConfig(max_obs_tokens=4000))
    [traj] = loop.run([{"question": "What is 6*7?", "answer": "42"}])
    text = tokenizer.decode(traj.response_ids, skip_special_tokens=False)
    assert "<|im_start|>tool\n42\nstderr:\nwarn<|im_end|>" in text
    assert "<|im_start|>tool\npartial\nstderr:\nTraceback" in text
    assert "ValueError: bad input\n[run ended: error, exit code 1]<|im_end|>" in text
    assert traj.metrics["tool_calls"] == 2
    assert traj.metrics["tool_errors"] == 1
    assert traj.reward_components["tool_use"] == 0.5
    assert traj.reward == 1.5
    assert "python" in traj.prompt_text  # the tool schema reached the model
    sandbox.close()
