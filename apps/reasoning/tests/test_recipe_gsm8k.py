"""The GSM8K recipe's glue (scripts/recipes/gsm8k.py): its shipped subsets are disjoint and prepare cleanly, its
overrides pass `reasoning train --dry-run`, the warm-up goes through `reasoning warmup`, and eval samples are read
into per-row accuracy in dev order. The full recipe is `nox -s recipe-gsm8k` (a benchmark, not CI)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "scripts" / "recipes"))
import gsm8k  # noqa: E402

BIN = Path(sys.executable).parent


def _questions(name: str) -> list[str]:
    text = (gsm8k.DATA / f"{name}.jsonl").read_text(encoding="utf-8")
    return [json.loads(line)["question"] for line in text.splitlines()]


def test_shipped_subsets_are_disjoint_and_sized() -> None:
    train, dev = _questions("train"), _questions("dev")
    assert (len(train), len(dev)) == (400, 100)
    assert not set(train) & set(dev)


def test_overrides_pass_the_dry_run(tmp_path: Path) -> None:
    rows = tmp_path / "train.jsonl"
    prepare = [BIN / "reasoning", "prepare-data", "--dataset", "gsm8k", "--input", gsm8k.DATA / "train.jsonl",
               "--out", rows, "--limit", "4"]  # fmt: skip
    subprocess.run(prepare, check=True)
    assert all("solution" in json.loads(r)["extra_info"] for r in rows.read_text().splitlines())  # for the warm-up
    args = gsm8k.parse(["--steps", "3", "--prompts", "2"])
    cmd = [BIN / "reasoning", "train", "--config", "grpo", "--engine", "vllm", "--dry-run", "--train-data", rows,
           *gsm8k.train_overrides(args, tmp_path / "warm", tmp_path / "grpo")]  # fmt: skip
    done = subprocess.run(cmd, check=False, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "total_steps: 3" in done.stdout and "train_batch_size: 2" in done.stdout


def test_warmup_goes_through_the_app_command(tmp_path: Path) -> None:
    cmd = gsm8k.warmup_command(gsm8k.parse([]), tmp_path / "rows.jsonl", tmp_path / "warm")
    assert cmd[:2] == [gsm8k.tool("reasoning"), "warmup"]
    assert "--epochs" in cmd and str(tmp_path / "warm") in map(str, cmd)


def test_row_scores_follow_dev_order(tmp_path: Path) -> None:
    records = [{"problem": 1, "sample": 0, "score": 0.0}, {"problem": 0, "sample": 0, "score": 1.0}]
    (tmp_path / "samples_gsm8k.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    assert gsm8k.row_scores(tmp_path) == [1.0, 0.0]


def test_row_scores_average_a_rows_samples(tmp_path: Path) -> None:
    records = [{"problem": p, "sample": k, "score": float(s)} for p, k, s in
               [(1, 0, 1), (0, 0, 0), (1, 1, 0), (0, 1, 0), (1, 2, 1), (0, 2, 1), (1, 3, 1), (0, 3, 0)]]  # fmt: skip
    (tmp_path / "samples_gsm8k.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    assert gsm8k.row_scores(tmp_path) == [0.25, 0.75]


def test_eval_flags_parse_as_the_app_reads_them() -> None:
    from rlloom_apps.reasoning.cli import build_parser

    for flags, expected in (([], (0.6, 4)), (["--eval-samples", "1", "--eval-temperature", "0"], (0.0, 1))):
        command = ["eval", "--data", "x.jsonl", *map(str, gsm8k.eval_flags(gsm8k.parse(flags)))]
        parsed = build_parser().parse_args(command)
        assert (parsed.temperature, parsed.n, parsed.max_tokens) == (*expected, 256)


def test_evals_start_vllm_eager_and_parse_as_the_app_reads_them(tmp_path: Path) -> None:
    """The eval command the recipe runs is one `reasoning eval` accepts, with --enforce-eager on vLLM only."""
    from rlloom_apps.reasoning.cli import build_parser

    (tmp_path / "config.json").write_text("{}")
    for engine, eager in (("vllm", True), ("hf", False)):
        args = gsm8k.parse(["--model", str(tmp_path), "--out", str(tmp_path / "run"), "--engine", engine])
        chain = gsm8k.Chain(args, "reasoning", ["--temperature", "0"], lambda _folder: {})
        command = chain.eval_command("untrained", tmp_path)
        assert command[:2] == [gsm8k.tool("reasoning"), "eval"]
        parsed = build_parser().parse_args([str(a) for a in command[1:]])
        assert (parsed.engine, parsed.enforce_eager, parsed.temperature) == (engine, eager, 0.0)


def test_filter_rows_samples_as_grpo_and_feeds_train(tmp_path: Path) -> None:
    """The recipe's filter-rows command is one the app accepts, sampling as GRPO will (temperature, top-p 1,
    length), and `train` then reads the rows it keeps; --filter-samples 0 trains on every row."""
    from rlloom_apps.reasoning.cli import build_parser

    (tmp_path / "config.json").write_text("{}")
    args = gsm8k.parse(["--model", str(tmp_path), "--out", str(tmp_path / "run"), "--temperature", "0.8"])
    chain = gsm8k.Chain(args, "reasoning", [], lambda _folder: {})
    ran: list[list[str]] = []
    chain.run = lambda name, argv, **_: ran.append([str(a) for a in argv]) or 0.0  # type: ignore[method-assign]
    kept = chain.filter_rows(chain.warm, gsm8k.filter_flags(args))
    parsed = build_parser().parse_args(ran[0][1:])
    assert ran[0][1] == "filter-rows" and parsed.data == [chain.train_rows] and parsed.out == kept
    assert (parsed.n, parsed.temperature, parsed.top_p, parsed.max_tokens) == (4, 0.8, 1.0, 256)
    assert parsed.enforce_eager and parsed.model == chain.warm
    chain.train(["--score-workers", "1"], kept)
    assert ran[1][ran[1].index("--train-data") + 1] == str(kept)
    assert "rollout.temperature=0.8" in gsm8k.train_overrides(args, chain.warm, chain.grpo)


@pytest.mark.parametrize("flags", [["--filter-samples", "1"], ["--filter-samples", "-2"], ["--temperature", "0"]])
def test_filter_and_temperature_flags_refuse_what_cannot_work(flags: list[str]) -> None:
    with pytest.raises(SystemExit):
        gsm8k.parse(flags)


def test_seed_reaches_warmup_and_grpo(tmp_path: Path) -> None:
    args = gsm8k.parse(["--seed", "3"])
    warmup = [str(a) for a in gsm8k.warmup_command(args, tmp_path / "rows.jsonl", tmp_path / "warm")]
    assert warmup[warmup.index("--seed") + 1] == "3"
    assert "trainer.seed=3" in gsm8k.train_overrides(args, tmp_path / "warm", tmp_path / "grpo")
    assert "--seed" not in map(str, gsm8k.eval_flags(args))  # every seed's evals sample the same way
