"""`rlloom-rollout serve` end to end: a saved model folder served by a real process, queried with `openai`."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from rlloom.core_rl.tiny import tiny_qwen2


def test_missing_model_folder_is_a_clear_error(tmp_path: Path) -> None:
    from rlloom.rollout.cli import main

    with pytest.raises(SystemExit, match="not a folder"):
        main(["serve", "--model", str(tmp_path / "nope")])


@pytest.mark.slow
def test_serve_answers_the_openai_client(tok: Any, tmp_path: Path) -> None:
    folder = tmp_path / "tiny-model"
    tiny_qwen2(tok).save_pretrained(folder)
    tok.save_pretrained(folder)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "rlloom.rollout.cli", "serve", "--model", str(folder), "--port", str(port)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 300  # generous: CI machines are shared
        while True:
            assert proc.poll() is None, f"server exited early:\n{proc.stdout.read() if proc.stdout else ''}"
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "server did not come up in 300 s"
            time.sleep(0.3)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)
        assert [m.id for m in client.models.list()] == ["tiny-model"]
        chat = client.chat.completions.create(
            model="tiny-model", messages=[{"role": "user", "content": "hi"}], max_tokens=8, seed=0
        )
        assert chat.choices[0].finish_reason in ("stop", "length") and chat.usage.completion_tokens <= 8
    finally:
        proc.terminate()
        proc.wait(timeout=30)
