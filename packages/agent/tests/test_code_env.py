"""CodeEnv: the `python` tool runs in rlloom-rewards' sandbox; output and tracebacks come back as observations."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from rlloom.agent.envs.code import CodeEnv, clean_traceback, format_run, python_toolset
from rlloom.agent.loop import AgentLoop, AgentLoopConfig
from rlloom.agent.rewards import AgentRubric
from rlloom.rewards.code import execute


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


HARNESS_TRACEBACK = """Traceback (most recent call last):
  File "/srv/app/.venv/lib/python3.11/site-packages/rlloom/rewards/code/sandboxed.py", line 325, in <module>
  File "/srv/app/.venv/lib/python3.11/site-packages/rlloom/rewards/code/sandboxed.py", line 248, in _run_script
  File "solution.py", line 2, in <module>
    json.loads("{x")
  File "/root/.pyenv/versions/3.11.7/lib/python3.11/json/decoder.py", line 337, in decode
    obj, end = self.raw_decode(s, idx=_w(s, 0).end())
  File "/home/me/project/helper.py", line 3, in g
    raise KeyError(k)
json.decoder.JSONDecodeError: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)
"""


def test_tracebacks_show_the_program_frames_without_host_paths() -> None:
    assert (
        clean_traceback(HARNESS_TRACEBACK)
        == """Traceback (most recent call last):
  File "solution.py", line 2, in <module>
    json.loads("{x")
  File "json/decoder.py", line 337, in decode
    obj, end = self.raw_decode(s, idx=_w(s, 0).end())
  File "helper.py", line 3, in g
    raise KeyError(k)
json.decoder.JSONDecodeError: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)
"""
    )


def test_long_output_keeps_the_error_at_its_end(tokenizer: Any, replay_engine: Any) -> None:
    """Much output then an exception, under max_obs_tokens=400: the head and the final error line both stay."""
    turns = [call("print('A' * 5000)\nimport json\njson.loads('{x')"), "done"]
    sandbox = python_toolset(timeout=10.0, allow_weak_isolation=True)
    engine = replay_engine(tokenizer, lambda ctx: turns[ctx.count("<|im_start|>assistant") - 1])
    loop = AgentLoop(
        engine, tokenizer, lambda: CodeEnv(sandbox, AgentRubric(final_is)), AgentLoopConfig(max_obs_tokens=400)
    )
    [traj] = loop.run([{"question": "q", "answer": "x"}])
    sandbox.close()
    obs = traj.response_text.split("<|im_start|>tool\n")[1].split("<|im_end|>")[0]
    assert len(tokenizer(obs, add_special_tokens=False)["input_ids"]) == 400
    assert obs.startswith("A" * 100)
    assert obs.endswith(
        "json.decoder.JSONDecodeError: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"
        "\n[run ended: error, exit code 1]"
    )
    assert traj.metrics["obs_truncated"] == 1
    full = format_run(execute("import json\njson.loads('{x')", timeout=10.0, allow_weak_isolation=True))
    assert 'File "solution.py", line 2, in <module>' in full
    assert 'File "json/decoder.py"' in full
    assert "sandboxed.py" not in full and "/lib/python" not in full and str(Path.home()) + "/" not in full


def test_weak_isolation_is_refused_when_the_tool_is_built(tmp_path: Path) -> None:
    # a machine without util-linux's `unshare` (PATH without it, in a fresh process: the probe is cached per
    # process) has only weak isolation; the refusal used to come back from every call as a tool error the model saw
    script = (
        "from rlloom.agent import python_toolset\n"
        "from rlloom.rewards.code import WeakIsolationError\n"
        "try:\n"
        "    python_toolset()\n"
        "except WeakIsolationError as err:\n"
        "    print('REFUSED', err)\n"
        "python_toolset(allow_weak_isolation=True)\n"
        "print('BUILT')\n"
    )
    env = {"PATH": str(tmp_path), "HOME": str(tmp_path), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-c", script]
    done = subprocess.run(command, check=False, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "REFUSED python_tool: this machine gives model code only weak isolation" in done.stdout
    assert "allow_weak_isolation=True" in done.stdout and done.stdout.rstrip().endswith("BUILT")
