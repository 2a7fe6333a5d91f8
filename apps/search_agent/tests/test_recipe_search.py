"""The search recipe's glue (scripts/recipes/search.py): its overrides pass `search-agent train --dry-run`, eval
predictions are read into per-question scores, the valid-format rate reads only what the model wrote, and the
report holds hand-computed means. The full recipe is `nox -s recipe-search` (a benchmark, not CI)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "scripts" / "recipes"))
import search  # noqa: E402
from recipe_common import Runner, write_report  # noqa: E402

VALID = (
    "<think> who is it </think>\n<search> kiss and tell </search>"
    "\n\n<information>Doc 1 (Title: X) she said <answer> not mine </answer></information>\n\n"
    "<think> found </think>\n<answer> Chief of Protocol </answer>"
)
HINTED = "I think so." + search.SearchEnvConfig().invalid_action_text + "<think> ok </think>\n<answer> x </answer>"


def test_format_valid_reads_the_model_turns_only() -> None:
    assert search.format_valid(VALID) == 1.0
    assert search.format_valid(HINTED) == 0.0  # the environment had to correct a turn
    assert search.format_valid("<answer> Paris </answer>") == 0.0  # no <think> first: Search-R1's rule
    assert search.format_valid("Paris.") == 0.0


def test_row_scores_in_dev_order(tmp_path: Path) -> None:
    rows = [
        {"data_source": "hotpotqa", "index": 0, "em": 1.0, "f1": 1.0, "searches": 1.0, "response": VALID},
        {"data_source": "hotpotqa", "index": 1, "em": 0.0, "f1": 0.5, "searches": 2.0, "response": HINTED},
    ]
    (tmp_path / "predictions_search.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert search.row_scores(tmp_path) == {
        "em": [1.0, 0.0],
        "f1": [1.0, 0.5],
        "searches": [1.0, 2.0],
        "format_valid": [1.0, 0.0],
    }


def test_row_scores_average_each_questions_samples(tmp_path: Path) -> None:
    """Two samples per question, written question by question as eval writes them; dev rows 5 then 2."""

    keys = ("index", "sample", "em", "f1", "searches", "response")
    records = [
        {"data_source": "hotpotqa", **dict(zip(keys, values, strict=True))}
        for values in (
            (5, 0, 1.0, 1.0, 1.0, VALID),
            (5, 1, 0.0, 0.4, 3.0, HINTED),
            (2, 0, 0.0, 0.0, 0.0, "Paris."),
            (2, 1, 0.0, 0.3, 2.0, VALID),
        )
    ]
    (tmp_path / "predictions_search.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    scores = search.row_scores(tmp_path)
    assert scores["em"] == [0.5, 0.0]
    assert scores["f1"] == [pytest.approx(0.7), pytest.approx(0.15)]
    assert scores["searches"] == [2.0, 1.0]
    assert scores["format_valid"] == [0.5, 0.5]  # VALID counts, HINTED and a bare reply do not
    (tmp_path / "predictions_search.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records[:3]))
    with pytest.raises(SystemExit, match=r"questions have \[1, 2\] samples"):
        search.row_scores(tmp_path)


def test_eval_flags_parse_with_the_apps_parser() -> None:
    from rlloom_apps.search_agent.cli import build_parser
    from rlloom_apps.search_agent.eval_settings import EvalSettings

    args = search.parse([])
    assert (args.eval_samples, args.eval_temperature) == (4, 0.6)
    given = [
        "eval",
        "--data",
        "d.jsonl",
        "--model",
        "m",
        "--index",
        "i",
        *search.limits(args),
        *search.eval_flags(args),
    ]
    parsed = build_parser().parse_args(given)
    assert (parsed.n, parsed.temperature, parsed.seed, parsed.max_turns) == (4, 0.6, 0, 3)
    settings = EvalSettings(**{k: getattr(parsed, k) for k in EvalSettings.model_fields if k != "progress"})
    assert settings.loop_config().sampling.seed == 0  # accepted as eval accepts it: sampled, seeded
    assert "avg@4 at T 0.6" in search.title(args)
    greedy = search.parse(["--eval-samples", "1", "--eval-temperature", "0"])
    parsed = build_parser().parse_args(["eval", "--data", "d", "--model", "m", *search.eval_flags(greedy)])
    assert (parsed.n, parsed.temperature) == (1, 0.0) and "greedy" in search.title(greedy)
    with pytest.raises(SystemExit, match="--eval-samples 4 needs --eval-temperature > 0"):
        search.eval_flags(search.parse(["--eval-temperature", "0"]))


def test_report_means_and_interval(tmp_path: Path) -> None:
    runner = Runner(tmp_path / "log")
    runner("echo", [sys.executable, "-c", "print('hi')"])
    scores = {
        "untrained": {"f1": [0.0, 0.0, 0.0, 0.0]},
        "warmup": {"f1": [0.0, 0.5, 0.0, 1.0]},
        "rl": {"f1": [0.5, 1.0, 0.5, 1.0]},
    }
    comparisons = {"rl - warmup": ("f1", "warmup", "rl")}
    report = write_report(tmp_path, "t", scores=scores, comparisons=comparisons, runner=runner, extra={"dev_rows": 4})
    assert report["means"]["warmup"]["f1"] == pytest.approx(0.375)
    interval = report["intervals"]["rl - warmup"]
    assert interval["mean"] == pytest.approx(0.375)  # differences 0.5, 0.5, 0.5, 0: a resample lies in [0, 0.5]
    assert 0.0 <= interval["low"] <= interval["mean"] <= interval["high"] <= 0.5
    assert json.loads((tmp_path / "report.json").read_text())["commands"][0]["exit"] == 0
    assert "| rl | 0.750 |" in (tmp_path / "report.md").read_text()


def test_train_overrides_pass_the_dry_run(tmp_path: Path) -> None:
    """Every key the recipe sets is one `search-agent train` knows (checked without torch)."""
    bin_dir = Path(sys.executable).parent
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(json.dumps({"_id": "1", "title": "Paris", "text": "Paris is in France."}) + "\n")
    index = tmp_path / "index"
    subprocess.run([bin_dir / "rlloom-retrieval", "build-index", "--corpus", corpus, "--out", index], check=True)
    queries = tmp_path / "q.jsonl"
    queries.write_text(json.dumps({"_id": "q", "text": "where is paris", "metadata": {"answers": ["France"]}}) + "\n")
    rows = tmp_path / "rows.jsonl"
    prepare = [bin_dir / "search-agent", "prepare-data", "--data-source", "hotpotqa", "--input", queries, "--out", rows]
    subprocess.run(prepare, check=True)
    args = search.parse(["--steps", "3"])
    assert isinstance(args, argparse.Namespace)
    overrides = search.train_overrides(args, tmp_path / "warm", tmp_path / "grpo")
    cmd = [bin_dir / "search-agent", "train", "--config", "grpo", "--engine", "vllm", "--dry-run",
           "--train-data", rows, "--index", index, *overrides]  # fmt: skip
    done = subprocess.run(cmd, check=False, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "total_steps: 3" in done.stdout and "max_turns: 3" in done.stdout
    # the recipe's reward and loss: v0.3's table graded by F1, no KL term (its reference forward is skipped)
    assert "use_loss: false" in done.stdout
    from rlloom_apps.search_agent.settings import CONFIGS, FormatRewardSettings, load_train_config

    _, settings = load_train_config(CONFIGS / "grpo.yaml", overrides)
    assert settings.format_reward == FormatRewardSettings(answer_score="f1")


def test_a_rerun_keeps_finished_steps(tmp_path: Path) -> None:
    runner = Runner(tmp_path / "log")
    marker = tmp_path / "table.md"
    marker.write_text("done")
    runner("eval", [sys.executable, "-c", "raise SystemExit(3)"], done=marker)  # not run: its output is there
    assert runner.steps[0]["kept"] and runner.steps[0]["exit"] == 0
    with pytest.raises(SystemExit, match="exit 3"):
        runner("eval again", [sys.executable, "-c", "raise SystemExit(3)"])


def test_seeds_pool_each_questions_difference_over_the_runs(tmp_path: Path) -> None:
    """Two runs of two questions: RL - warm-up F1 per question (0.5, 0) and (0.1, 0.3); pooled per question
    (0.3, 0.15), mean 0.225; each interval lies within its differences' range."""
    import search_seeds

    def write(folder: Path, f1s: list[float]) -> None:
        folder.mkdir(parents=True)
        rows = [{"data_source": "hotpotqa", "index": i, "em": 0.0, "f1": f, "searches": 1.0, "response": VALID}
                for i, f in enumerate(f1s)]  # fmt: skip
        (folder / "predictions_search.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))

    for run, warm, rl in (("s0", [0.0, 0.2], [0.5, 0.2]), ("s1", [0.1, 0.1], [0.2, 0.4])):
        write(tmp_path / run / "eval" / "warmup", warm)
        write(tmp_path / run / "eval" / "rl", rl)
    got = search_seeds.pooled([tmp_path / "s0", tmp_path / "s1"])
    assert got["s0 rl - warmup (f1)"]["mean"] == pytest.approx(0.25)
    assert got["s1 rl - warmup (f1)"]["mean"] == pytest.approx(0.2)
    both = got["2 runs pooled rl - warmup (f1)"]
    assert both["mean"] == pytest.approx(0.225)
    assert 0.15 - 1e-9 <= both["low"] <= both["high"] <= 0.3 + 1e-9
    assert got["2 runs pooled rl - warmup (em)"]["mean"] == 0.0
    write(tmp_path / "s2" / "eval" / "warmup", [0.0])
    write(tmp_path / "s2" / "eval" / "rl", [0.0])
    with pytest.raises(SystemExit, match="different numbers of dev questions"):
        search_seeds.pooled([tmp_path / "s0", tmp_path / "s2"])
