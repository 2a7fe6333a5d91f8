"""Ctrl-C during training: one line naming the step and the command that resumes, exit 130, no traceback; the
same command then resumes from the last checkpoint (issue 29)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlloom.core_rl.cli.app_args import interrupted_message, last_checkpoint_step, last_logged_step, quiet_interrupt

pytestmark = [pytest.mark.slow]

SCRIPT = """
import sys
sys.path.insert(0, {tests!r})
import tiny_run
from rlloom.core_rl.cli.app_args import run_interruptible
model, out = sys.argv[1], sys.argv[2]
run_interruptible(lambda: tiny_run.run(model, out, ["trainer.total_steps=400", "trainer.save_every=1"]), out)
"""


def _interrupt_after(command: list[str], metrics: Path, step: int) -> subprocess.CompletedProcess[str]:
    """Start `command`, send SIGINT once metrics.jsonl logs `step`, and wait for it to end."""
    # Ctrl-C as a terminal delivers it: pytest-xdist's workers ignore SIGINT, and an ignored signal stays ignored
    # across exec (Python then installs no KeyboardInterrupt handler and the run trains on); a handler does not
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    finally:
        signal.signal(signal.SIGINT, previous)
    deadline = time.monotonic() + 300
    while last_logged_step(metrics.parent) < step and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert proc.poll() is None, f"the run ended before step {step}: {proc.communicate()[1][-2000:]}"
    os.kill(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    return subprocess.CompletedProcess(command, proc.returncode, out, err)


def test_ctrl_c_prints_one_line_exits_130_and_the_same_command_resumes(tiny_model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    script = tmp_path / "train.py"
    script.write_text(SCRIPT.format(tests=str(Path(__file__).parent)), encoding="utf-8")
    command = [sys.executable, str(script), str(tiny_model_dir), str(out)]

    first = _interrupt_after(command, out / "metrics.jsonl", 2)
    assert first.returncode == 130, first.stderr[-2000:]
    assert "Traceback" not in first.stderr
    lines = [line for line in first.stderr.splitlines() if line.startswith("interrupted at step")]
    assert len(lines) == 1, first.stderr[-2000:]
    reached, saved = last_logged_step(out), last_checkpoint_step(out)
    assert saved is not None and 1 <= saved <= reached
    assert lines[0].startswith(f"interrupted at step {reached} ")
    assert f"resumes from the step {saved} checkpoint" in lines[0]
    assert lines[0].endswith(f"train.py {tiny_model_dir} {out}")

    second = _interrupt_after(command, out / "metrics.jsonl", reached + 1)
    assert second.returncode == 130, second.stderr[-2000:]
    assert f"(step {saved})" in second.stderr  # run_folder's "resuming from ... (step N)"
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == sorted(set(steps)), "a resumed run re-logged or skipped steps"


def test_interrupted_message_before_any_checkpoint(tmp_path: Path) -> None:
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "x": 0}\n{"step": 2, "x": 1}\n{"st', encoding="utf-8")
    line = interrupted_message(tmp_path, ["/venv/bin/reasoning", "train", "--train-data", "a b.jsonl"])
    assert line == (
        f"interrupted at step 2 ({tmp_path}); the same command starts over: no checkpoint yet: "
        "reasoning train --train-data 'a b.jsonl'"
    )


def test_quiet_interrupt_ends_a_command_with_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    @quiet_interrupt
    def main(argv: list[str]) -> int:
        raise KeyboardInterrupt  # as Ctrl-C while a model or torch loads

    with pytest.raises(SystemExit) as ended:
        main([])
    assert ended.value.code == 130
    assert capsys.readouterr().err == "interrupted\n"
