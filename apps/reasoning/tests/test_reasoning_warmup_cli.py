"""`reasoning warmup` on real GSM8K rows: a tiny model learns the demonstrations' text beyond its letter counts.

The bound is computed here, independently of the warm-up: the cross-entropy of the held-out demonstrations'
answer tokens under the training answers' token frequencies (add-one smoothed), which is the best any model that
ignores context can do. A random model is far above it; after the warm-up the model must be below it, which it can
only be by reading context (the solution's own words, the fixed 'The final answer is \\boxed{' ending).
"""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path

import pytest
from rlloom_apps.reasoning.cli import main

from rlloom.core_rl.data import read_jsonl

FIXTURE = Path(__file__).parent / "data" / "gsm8k_test_head24.jsonl"
README = Path(__file__).parents[1] / "README.md"


@pytest.fixture(scope="module")
def rows(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from rlloom.core_rl.tiny import save_tiny_model

    root = tmp_path_factory.mktemp("warmup")
    saved = save_tiny_model(root)
    prepared = root / "gsm8k.jsonl"
    main(["prepare-data", "--dataset", "gsm8k", "--input", str(FIXTURE), "--out", str(prepared), "--split", "test"])
    lines = prepared.read_text().splitlines()
    (root / "train.jsonl").write_text("\n".join(lines[:20]) + "\n")
    (root / "val.jsonl").write_text("\n".join(lines[20:]) + "\n")
    return {
        "model": saved.model,
        "tokenizer": saved.tokenizer,
        "train": root / "train.jsonl",
        "val": root / "val.jsonl",
    }


def unigram_bound(tokenizer: object, train: Path, val: Path) -> float:
    """Cross-entropy (nats/token) of val's answer tokens + EOS under train's add-one-smoothed token frequencies."""
    from rlloom_apps.reasoning.warmup_rows import demonstrations

    def answer_ids(path: Path) -> list[int]:
        built, _ = demonstrations(list(read_jsonl(path)))
        eos = tokenizer.eos_token_id  # type: ignore[attr-defined]
        return [i for _, text in built for i in [*tokenizer(text, add_special_tokens=False)["input_ids"], eos]]  # type: ignore[operator]

    counts = Counter(answer_ids(train))
    vocab, total = len(tokenizer), sum(counts.values())  # type: ignore[arg-type]
    held = answer_ids(val)
    return -sum(math.log((counts[i] + 1) / (total + vocab)) for i in held) / len(held)


def test_warmup_learns_the_demonstrations_and_saves_a_loadable_model(
    rows: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from transformers import AutoModelForCausalLM

    from rlloom.core_rl.workers import load_pretrained_tokenizer

    out = tmp_path / "warm"
    flags = ["--epochs", "12", "--lr", "3e-3", "--batch-size", "4"]
    main(["warmup", "--model", str(rows["model"]), "--tokenizer", str(rows["tokenizer"]), "--train-data",
          str(rows["train"]), "--val-data", str(rows["val"]), "--out", str(out), *flags])  # fmt: skip
    printed = capsys.readouterr().out
    summary = json.loads((out / "warmup.json").read_text())
    assert summary["demonstrations"] == 20
    assert summary["steps"] == math.ceil(12 * 20 / 4) == len(summary["losses"])
    bound = unigram_bound(load_pretrained_tokenizer(str(rows["tokenizer"])), rows["train"], rows["val"])
    assert summary["heldout_before"] > bound > summary["heldout_after"], (summary["heldout_before"], bound)
    assert f"{summary['heldout_before']:.3f} -> {summary['heldout_after']:.3f}" in printed
    assert f"model.path={out}" in printed
    # the saved folder is the trained model: loaded as `reasoning train model.path=OUT` loads it, same held-out loss
    from rlloom_apps.reasoning.warmup import heldout_loss
    from rlloom_apps.reasoning.warmup_rows import demonstrations

    model = AutoModelForCausalLM.from_pretrained(str(out))
    tokenizer = load_pretrained_tokenizer(str(out))
    val, _ = demonstrations(list(read_jsonl(rows["val"])))
    assert heldout_loss(model, tokenizer, val) == pytest.approx(summary["heldout_after"], rel=1e-4)


def test_rows_without_solutions_are_refused_before_the_model_loads(
    rows: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bare = tmp_path / "bare.jsonl"
    stripped = [{**row, "extra_info": {}} for row in read_jsonl(rows["train"])]
    bare.write_text("".join(json.dumps(row) + "\n" for row in stripped))
    with pytest.raises(SystemExit) as exit_:
        main(["warmup", "--model", str(tmp_path), "--train-data", str(bare), "--out", str(tmp_path / "o")])
    assert exit_.value.code == 2
    assert "extra_info.solution" in capsys.readouterr().err


def test_bad_settings_name_the_flag(rows: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["warmup", "--model", str(rows["model"]), "--train-data", str(rows["train"]), "--out", str(tmp_path),
              "--epochs", "0"])  # fmt: skip
    assert "epochs" in capsys.readouterr().err


def test_the_warmup_flags_and_defaults_are_the_documented_ones() -> None:
    """The README's defaults (--epochs 2, --lr 1e-5, --batch-size 8, 1,024 tokens per micro-batch, checkpointing
    off), the shared ones from core-rl's base, and the README's warm-up section names every settings flag."""
    from rlloom_apps.reasoning.cli import build_parser
    from rlloom_apps.reasoning.warmup_settings import WarmupSettings

    from rlloom.core_rl.workers import WarmupSettingsBase

    args = build_parser().parse_args(["warmup", "--model", "m", "--train-data", "t", "--out", "o"])
    assert {k: getattr(args, k) for k in WarmupSettings.model_fields} == {
        "lr": 1e-5, "batch_size": 8, "max_tokens_per_micro_batch": 1024, "gradient_checkpointing": False,
        "max_rows": None, "seed": 0, "epochs": 2.0,
    }  # fmt: skip
    assert issubclass(WarmupSettings, WarmupSettingsBase)
    section = README.read_text().split("## `reasoning warmup`")[1].split("\n## ")[0]
    missing = [name for name in WarmupSettings.model_fields if f"`--{name.replace('_', '-')}`" not in section]
    assert missing == []
