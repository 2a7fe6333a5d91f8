"""`reasoning eval`: prepared rows from real dataset records, sampled, scored and summarised.

A scripted engine (it answers each prompt with fixed texts) pins the figures to hand-computed values through the
real scorers (math checker, sandboxed MBPP/HumanEval tests); the CLI test runs a real HF engine on a tiny saved
model and re-scores its saved samples independently.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from rlloom_apps.reasoning.cli import main
from rlloom_apps.reasoning.data import read_jsonl, to_row
from rlloom_apps.reasoning.evaluate import EvalSettings, default_ks, run_eval, summary_text, write_outputs

from rlloom.core_rl.contracts import Completion, GenerationRequest
from rlloom.rewards.math import math_scorer

DATA = Path(__file__).parent / "data"


class ScriptedEngine:
    """Answers a prompt containing a key with that key's fixed samples (a stand-in for a model in unit tests)."""

    def __init__(self, script: dict[str, list[str]]) -> None:
        self.script = script
        self.requests: list[GenerationRequest] = []

    async def agenerate(self, request: GenerationRequest) -> list[Completion]:
        self.requests.append(request)
        assert request.messages is not None
        content = request.messages[0]["content"]
        texts = next(v for k, v in self.script.items() if k in content)
        assert len(texts) == request.sampling.n
        await asyncio.sleep(0.01 * (len(self.requests) % 3))  # answers arrive out of order
        finish = ["length", *["stop"] * (len(texts) - 1)]
        return [
            Completion(request.request_id, [0], [1] * (5 + j), t, finish[j], sample_index=j)  # type: ignore[arg-type]
            for j, t in enumerate(texts)
        ]


def rows(dataset: str, file: str, split: str = "test") -> list[dict[str, object]]:
    return [to_row(dataset, record, i, split) for i, record in enumerate(read_jsonl(DATA / file))]


def test_mbpp_rows_take_the_split_by_task_id(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "mbpp.jsonl"
    main(
        ["prepare-data", "--dataset", "mbpp", "--input", str(DATA / "mbpp_tasks_1_11_12_601.jsonl"), "--out", str(out)]
    )
    prepared = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["extra_info"]["task_id"] for r in prepared] == [11, 12]  # 1 is a prompt task, 601 a training task
    assert prepared[0]["reward_model"]["ground_truth"]["test_list"][0].startswith("assert remove_Occ")
    with pytest.raises(SystemExit):
        main(["prepare-data", "--dataset", "mbpp", "--input", str(DATA / "mbpp_tasks_1_11_12_601.jsonl"),
              "--out", str(out), "--split", "dev"])  # fmt: skip
    assert "mbpp --split must be one of" in capsys.readouterr().err


def test_reference_solutions_score_full_marks() -> None:
    """The datasets' own solutions pass their prepared rows' tests: the prompt/test layout is right."""
    he = rows("humaneval", "humaneval_head2.jsonl")
    mbpp = rows("mbpp", "mbpp_tasks_1_11_12_601.jsonl")
    he_src = list(read_jsonl(DATA / "humaneval_head2.jsonl"))
    mbpp_src = list(read_jsonl(DATA / "mbpp_tasks_1_11_12_601.jsonl"))
    script = {r["prompt"][:60]: [f"```python\n{r['prompt']}{r['canonical_solution']}```"] for r in he_src}
    script |= {r["text"]: [f"Here:\n```python\n{r['code']}\n```"] for r in mbpp_src}
    result = run_eval(ScriptedEngine(script), he + mbpp, EvalSettings(n=1, score_workers=1), progress=False)
    assert {s.data_source: s.metrics["pass@1"] for s in result.report.sources} == {"humaneval": 1.0, "mbpp": 1.0}


def test_figures_through_real_scorers(tmp_path: Path) -> None:
    math = rows("math500", "math500_head3.jsonl")  # answers: (3, pi/2), p - q, 14/3
    golds = [r["reward_model"]["ground_truth"] for r in math]  # type: ignore[index]
    assert golds[2] == "\\frac{14}{3}"
    script = {
        "Convert the point": ["\\boxed{\\left(3, \\frac{\\pi}{2}\\right)}", "\\boxed{(3, \\pi/2)}", "\\boxed{3}", "no"],
        "Define": ["\\boxed{p - q}", "\\boxed{q - p}", "\\boxed{q-p}", "\\boxed{p+q}"],
        "If $f(x)": ["\\boxed{14/3}", "\\boxed{4\\frac{2}{3}}", "\\boxed{\\dfrac{14}{3}}", "\\boxed{5}"],
    }
    engine = ScriptedEngine(script)
    settings = EvalSettings(n=4, score_workers=1, seed=7)
    result = run_eval(engine, math, settings, progress=False)
    (source,) = result.report.sources
    m = source.metrics
    # correct per problem: 2, 1, 3 of 4
    assert m["avg@4"] == pytest.approx((2 + 1 + 3) / 12)
    assert m["pass@1"] == pytest.approx(0.5)
    assert m["pass@2"] == pytest.approx(((1 - 1 / 6) + (1 - 3 / 6) + 1.0) / 3)
    # majorities of all 4: the two polar forms (right), q - p (wrong), 14/3 in three spellings (right)
    assert m["maj@4"] == pytest.approx(2 / 3)
    assert [k for k in m if k.startswith("pass@")] == ["pass@1", "pass@2", "pass@4"]
    assert sorted((r.sampling.seed, r.messages[0]["content"][:6]) for r in engine.requests) == [  # type: ignore[index]
        (7, "Conver"),
        (8, "Define"),
        (9, "If $f("),
    ]
    assert result.lengths["math500"].truncated == pytest.approx(0.25)  # sample 0 of each "hit" max_tokens
    write_outputs(tmp_path, math, result, settings)
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["sources"][0]["metrics"] == pytest.approx(m)
    samples = [json.loads(line) for line in (tmp_path / "samples_math500.jsonl").read_text().splitlines()]
    assert len(samples) == 12 and samples[5]["response"] == "\\boxed{q - p}" and samples[5]["correct"] is False
    assert "| math500 | 3 |" in (tmp_path / "table.md").read_text()
    assert "truncated" in summary_text(result)


def test_settings_refuse_k_above_n() -> None:
    assert default_ks(6) == [1, 2, 4, 6]
    assert EvalSettings(n=8).k == [1, 2, 4, 8]
    with pytest.raises(ValueError, match="--k \\[16\\] must lie in 1..--n \\(8\\)"):
        EvalSettings(n=8, k=[1, 16])


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from rlloom.core_rl.tiny import save_tiny_model

    saved = save_tiny_model(tmp_path_factory.mktemp("tiny"))
    return {"model": saved.model, "tokenizer": saved.tokenizer}


def test_cli_with_a_real_engine(
    tiny_model: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows("math500", "math500_head3.jsonl")))
    model, tokenizer = str(tiny_model["model"]), str(tiny_model["tokenizer"])
    argv = ["eval", "--data", str(data), "--model", model, "--tokenizer", tokenizer, "--device", "cpu",
            "--n", "3", "--max-tokens", "12", "--temperature", "1.0", "--score-workers", "0"]  # fmt: skip
    main([*argv, "--out", str(tmp_path / "a")])
    main([*argv, "--out", str(tmp_path / "b")])
    assert "| math500 | 3 |" in capsys.readouterr().out
    a = [json.loads(x) for x in (tmp_path / "a" / "samples_math500.jsonl").read_text().splitlines()]
    b = [json.loads(x) for x in (tmp_path / "b" / "samples_math500.jsonl").read_text().splitlines()]
    assert len(a) == 9 and [s["response"] for s in a] == [s["response"] for s in b]  # seeded: the run repeats
    assert len({s["response"] for s in a}) > 1  # temperature 1 on random weights: samples differ
    golds = [r["reward_model"]["ground_truth"] for r in rows("math500", "math500_head3.jsonl")]  # type: ignore[index]
    rescored = [math_scorer(s["response"], golds[s["problem"]]).score for s in a]
    results = json.loads((tmp_path / "a" / "results.json").read_text())
    assert results["sources"][0]["metrics"]["avg@3"] == pytest.approx(sum(rescored) / 9)
    assert results["lengths"]["math500"]["max_tokens"] <= 12


def test_cli_errors_name_the_flag(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        main(["eval", "--data", str(tmp_path / "missing.jsonl"), "--model", str(tmp_path)])
    with pytest.raises(SystemExit):
        main(["eval", "--data", str(DATA / "math500_head3.jsonl"), "--model", str(tmp_path), "--n", "2", "--k", "4"])


def test_chat_template_variables_reach_every_eval_request(capsys: pytest.CaptureFixture[str]) -> None:
    """--chat-template-kwargs (Qwen3's enable_thinking: evaluate with what the model was trained with) rides on
    every request; bad JSON is a usage error naming the flag."""
    engine = ScriptedEngine({"": ["\\boxed{1}"]})
    settings = EvalSettings(n=1, chat_template_kwargs={"enable_thinking": False})
    run_eval(engine, rows("math500", "math500_head3.jsonl"), settings, progress=False)
    assert [r.chat_template_kwargs for r in engine.requests] == [{"enable_thinking": False}] * 3
    with pytest.raises(SystemExit):
        main(["eval", "--data", str(DATA / "math500_head3.jsonl"), "--model", "m", "--chat-template-kwargs", "{oops"])
    assert "--chat-template-kwargs: not JSON" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # was a pydantic traceback after the model had loaded
        main(["eval", "--data", str(DATA / "math500_head3.jsonl"), "--model", "m", "--chat-template-kwargs",
              '{"tokenize": true}'])  # fmt: skip
    err = capsys.readouterr().err
    assert "--chat-template-kwargs: tokenize cannot be set there" in err and "Traceback" not in err
