"""The warm-up command's shared part: the settings every app takes (torch-free, with `supervised_train`'s defaults),
settings flags from a pydantic model (a bad value refused by its flag, an --out that is a file refused before
anything loads), and a run that saves what `train` changed together with warmup.json (the settings and the
result), reloadable as a transformers checkpoint."""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from pydantic import BaseModel, Field, ValidationError

from rlloom.core_rl.tiny import save_tiny_model
from rlloom.core_rl.workers import (
    WarmupSettingsBase,
    add_settings_arguments,
    add_warmup_arguments,
    check_warmup_flags,
    run_warmup,
    supervised_train,
)


class Settings(BaseModel):
    steps: int = Field(default=10, ge=0, description="AdamW steps.")
    lr: float = Field(default=1e-5, gt=0, description="Learning rate.")
    progress: bool = Field(default=True, description="Not a flag.")


@dataclasses.dataclass
class Result:
    steps: int
    losses: list[float]


def describe(err: ValidationError) -> str:
    return "; ".join(f"--{problem['loc'][0]}: {problem['msg']}" for problem in err.errors())


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="app warmup")
    add_warmup_arguments(p, train_help="rows", val_help="held-out rows")
    add_settings_arguments(p, Settings, skip=("progress",))
    return p


def test_settings_come_from_their_flags_and_a_bad_one_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    p = parser()
    given = ["--model", str(tmp_path), "--train-data", "rows.jsonl", "--out", str(tmp_path / "out")]
    settings = check_warmup_flags(p, p.parse_args([*given, "--steps", "3"]), Settings, describe, skip=("progress",))
    assert settings == Settings(steps=3, lr=1e-5, progress=True)
    assert "--progress" not in p.format_help()
    with pytest.raises(SystemExit) as info:
        check_warmup_flags(p, p.parse_args([*given, "--steps", "-1"]), Settings, describe, skip=("progress",))
    assert info.value.code == 2
    assert "--steps: Input should be greater than or equal to 0" in capsys.readouterr().err


def test_an_out_file_and_a_missing_model_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = parser()
    (tmp_path / "file").write_text("x")
    for model, out, message in (
        (tmp_path, tmp_path / "file", "is a file; give a folder for the warmed-up model"),
        (tmp_path / "missing", tmp_path / "out", "--model " + str(tmp_path / "missing") + ": not a folder"),
    ):
        args = p.parse_args(["--model", str(model), "--train-data", "r", "--out", str(out)])
        with pytest.raises(SystemExit):
            check_warmup_flags(p, args, Settings, describe, skip=("progress",))
        assert message in capsys.readouterr().err


def test_the_run_saves_what_train_changed_with_warmup_json(tmp_path: Path) -> None:
    saved = save_tiny_model(tmp_path / "tiny")
    p = parser()
    out = tmp_path / "warm"
    args = p.parse_args(["--model", str(saved.model), "--tokenizer", str(saved.tokenizer), "--train-data", "r",
                         "--out", str(out)])  # fmt: skip
    settings = Settings(steps=2)

    def train(model: Any, tokenizer: Any) -> Result:  # stands for an app's supervised steps: a visible change
        with torch.no_grad():
            model.lm_head.weight.fill_(0.25)
        assert tokenizer.chat_template is not None
        return Result(steps=2, losses=[1.5, 0.5])

    assert run_warmup(p, args, settings, train) == Result(steps=2, losses=[1.5, 0.5])
    summary = json.loads((out / "warmup.json").read_text())
    assert summary == {"settings": {"steps": 2, "lr": 1e-5, "progress": True}, "steps": 2, "losses": [1.5, 0.5]}
    from transformers import AutoModelForCausalLM

    reloaded = AutoModelForCausalLM.from_pretrained(str(out))
    assert torch.all(reloaded.lm_head.weight == 0.25)
    assert (out / "tokenizer_config.json").is_file()


def test_a_bool_setting_is_an_on_off_flag_pair() -> None:
    class Switches(BaseModel):
        gradient_checkpointing: bool = Field(default=False, description="Recompute activations.")
        max_tokens_per_micro_batch: int = Field(default=1024, ge=1, description="Tokens per forward.")

    p = argparse.ArgumentParser(prog="app warmup")
    add_settings_arguments(p, Switches)
    assert vars(p.parse_args([])) == {"gradient_checkpointing": False, "max_tokens_per_micro_batch": 1024}
    on = p.parse_args(["--gradient-checkpointing", "--max-tokens-per-micro-batch", "512"])
    assert (on.gradient_checkpointing, on.max_tokens_per_micro_batch) == (True, 512)
    assert p.parse_args(["--no-gradient-checkpointing"]).gradient_checkpointing is False


def test_the_shared_settings_default_as_supervised_train_does_and_refuse_a_typo_by_name() -> None:
    shared = {"lr": 1e-5, "batch_size": 8, "max_tokens_per_micro_batch": 1024, "gradient_checkpointing": False,
              "max_rows": None, "seed": 0}  # fmt: skip
    assert WarmupSettingsBase().model_dump() == shared
    defaults = inspect.signature(supervised_train).parameters
    for name in ("max_tokens_per_micro_batch", "gradient_checkpointing", "seed"):  # the loop's own defaults
        assert shared[name] == defaults[name].default, name
    for bad, field in (({"max_tokens_per_micro_batch": 0}, "max_tokens_per_micro_batch"), ({"epoch": 2}, "epoch")):
        with pytest.raises(ValidationError, match=field):
            WarmupSettingsBase(**bad)  # type: ignore[arg-type]


def test_the_shared_settings_and_their_flags_import_no_torch() -> None:
    code = (
        "import argparse, sys\n"
        "from rlloom.core_rl.workers import WarmupSettingsBase, add_settings_arguments\n"
        "p = argparse.ArgumentParser()\n"
        "add_settings_arguments(p, WarmupSettingsBase)\n"
        "print(WarmupSettingsBase(**vars(p.parse_args(['--max-rows', '3']))).max_rows, 'torch' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.split() == ["3", "False"]
