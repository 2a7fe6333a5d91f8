"""`reasoning filter-rows`: pass rates from real scorers select the rows GRPO can learn from; the command's files
and errors. The scripted engine pins pass rates to hand-counted verdicts; the CLI test runs a real HF engine on a
tiny random model, which solves nothing, so the command must refuse to write an empty training file."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from rlloom_apps.reasoning.cli import main
from rlloom_apps.reasoning.evaluate import EvalSettings, run_eval

from rlloom.rewards.difficulty import PassBand, select_by_pass_rate

sys.path.insert(0, str(Path(__file__).parent))
from test_reasoning_eval import DATA, ScriptedEngine, rows


def test_rows_solved_sometimes_are_kept_through_real_scorers() -> None:
    math = rows("math500", "math500_head3.jsonl")  # answers: (3, pi/2), p - q, 14/3
    script = {
        "Convert the point": ["\\boxed{(3, \\pi/2)}", "\\boxed{3}", "no", "\\boxed{(3, \\frac{\\pi}{2})}"],  # 2 of 4
        "Define": ["\\boxed{q - p}", "\\boxed{p+q}", "\\boxed{0}", "none"],  # 0 of 4
        "If $f(x)": ["\\boxed{14/3}", "\\boxed{4\\frac{2}{3}}", "\\boxed{\\dfrac{14}{3}}", "\\boxed{28/6}"],  # 4 of 4
    }
    result = run_eval(ScriptedEngine(script), math, EvalSettings(n=4, score_workers=1), progress=False)
    selection = select_by_pass_rate(math, result.report.records, PassBand())
    assert selection.rates == [0.5, 0.0, 1.0]
    assert [row["reward_model"]["ground_truth"] for row in selection.kept] == [math[0]["reward_model"]["ground_truth"]]  # type: ignore[index]
    assert selection.kept[0]["extra_info"]["pass_rate"] == 0.5


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    from rlloom.core_rl.tiny import save_tiny_model

    saved = save_tiny_model(tmp_path_factory.mktemp("tiny"))
    return ["--model", str(saved.model), "--tokenizer", str(saved.tokenizer), "--device", "cpu"]


def test_nothing_solved_writes_no_rows_and_says_what_to_change(
    tiny: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "rows.jsonl"
    main(["prepare-data", "--dataset", "gsm8k", "--input", str(DATA / "gsm8k_test_head24.jsonl"), "--out", str(data),
          "--limit", "2"])  # fmt: skip
    out, evals = tmp_path / "kept.jsonl", tmp_path / "eval"
    with pytest.raises(SystemExit, match=r"no row's pass rate lies in \(0, 1\); nothing written") as stop:
        main(["filter-rows", "--data", str(data), *tiny, "--n", "2", "--max-tokens", "4", "--score-workers", "0",
              "--out", str(out), "--eval-out", str(evals)])  # fmt: skip
    assert "Raise --n" in str(stop.value)
    assert "kept 0 of 2 rows (pass rate in (0, 1) over 2 samples each); 2 never solved" in capsys.readouterr().out
    assert not out.exists()
    samples = [json.loads(line) for line in (evals / "samples_gsm8k.jsonl").read_text().splitlines()]
    assert len(samples) == 4 and not any(s["correct"] for s in samples)  # the eval's files are kept to inspect


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--band", "0.5", "0.5"], "--band 0.5 0.5: low 0.5 is not below high 0.5"),
        (["--band", "0", "2"], "--band 0 2: high input should be less than or equal to 1"),
        (["--out", "kept.txt"], "--out kept.txt: give a .jsonl file"),
    ],
)
def test_bad_flags_stop_before_the_model_loads(
    flags: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["filter-rows", "--data", "rows.jsonl", "--model", "no/such/model", "--out", "kept.jsonl", *flags]
    with pytest.raises(SystemExit):
        main(argv)
    assert message in capsys.readouterr().err


def test_defaults_sample_as_grpo_does() -> None:
    from rlloom_apps.reasoning.cli import build_parser

    parsed = build_parser().parse_args(["filter-rows", "--data", "x.jsonl", "--out", "y.jsonl"])
    assert (parsed.n, parsed.temperature, parsed.top_p, parsed.band) == (8, 1.0, 1.0, [0.0, 1.0])
