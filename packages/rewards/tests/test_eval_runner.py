"""The evaluation runner on its own (no torch, no model): concurrency, seeding hook, scoring, lengths, files."""

from __future__ import annotations

import argparse
import asyncio
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from rlloom.rewards.eval_runner import (
    EvalSettings,
    add_eval_arguments,
    read_rows,
    report,
    run_eval,
    sampling_warnings,
    settings_from_args,
    summary_text,
)


@dataclass
class Sample:
    text: str
    token_ids: list[int]
    finish_reason: str


class ScriptedSampler:
    """Answers request (index, n) with the row's scripted texts; records how many requests overlap."""

    def __init__(self, script: list[list[str]]) -> None:
        self.script = script
        self.in_flight = 0
        self.most_in_flight = 0

    async def agenerate(self, request: tuple[int, int]) -> list[Sample]:
        index, n = request
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        await asyncio.sleep(0.01)
        self.in_flight -= 1
        texts = self.script[index]
        assert len(texts) == n
        return [Sample(t, [0] * (3 + i), "length" if i == 0 else "stop") for i, t in enumerate(texts)]


def gsm8k_row(answer: str) -> dict[str, Any]:
    prompt = [{"role": "user", "content": "q"}]
    return {"data_source": "gsm8k", "prompt": prompt, "reward_model": {"ground_truth": answer}}


def test_run_eval_scores_and_summarises(tmp_path: Path) -> None:
    rows = [gsm8k_row("7"), gsm8k_row("12"), gsm8k_row("5")]
    script = [["#### 7", "#### 7", "#### 8"], ["#### 11", "#### 11", "#### 12"], ["#### 1", "#### 2", "none"]]
    sampler = ScriptedSampler(script)
    settings = EvalSettings(n=3, k=[1, 3], concurrency=2, score_workers=1)
    result = run_eval(sampler, rows, settings, lambda i, row: (i, settings.n), progress=False)
    assert sampler.most_in_flight == 2  # never more than `concurrency` requests at once
    (source,) = result.report.sources
    # correct per problem: 2, 1, 0 of 3
    assert source.metrics["avg@3"] == pytest.approx(3 / 9)
    assert source.metrics["pass@3"] == pytest.approx(2 / 3)
    assert source.metrics["maj@3"] == pytest.approx(1 / 3)  # 7 wins, 11 beats 12, nothing for the third
    lengths = result.lengths["gsm8k"]
    assert (lengths.mean_tokens, lengths.max_tokens, lengths.truncated) == (4.0, 5, pytest.approx(1 / 3))
    assert "| gsm8k | 4 | 5 | 33.3% |" in summary_text(result)


def test_flags_round_trip_to_settings() -> None:
    parser = argparse.ArgumentParser()
    add_eval_arguments(parser)
    args = parser.parse_args(["--n", "8", "--k", "1", "8", "--temperature", "0", "--max-tokens", "64"])
    settings = settings_from_args(args)
    assert (settings.n, settings.k, settings.temperature, settings.max_tokens) == (8, [1, 8], 0.0, 64)
    assert json.loads(settings.model_dump_json())["top_p"] == 0.95  # defaults kept


def test_read_rows_limits_each_file_and_names_bad_input(tmp_path: Path) -> None:
    good = tmp_path / "good.jsonl"
    good.write_text("".join(json.dumps(gsm8k_row(str(i))) + "\n" for i in range(3)) + "\n")
    other = tmp_path / "other.jsonl"
    other.write_text("".join(json.dumps(gsm8k_row(str(i))) + "\n" for i in range(5, 8)))
    assert [r["reward_model"]["ground_truth"] for r in read_rows([good, other], limit=2)] == ["0", "1", "5", "6"]
    with pytest.raises(ValueError, match=r"given twice \(also as .*good.jsonl\); list each file once"):
        read_rows([good, tmp_path / "." / "good.jsonl"])
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(gsm8k_row("1")) + "\n{oops\n")
    with pytest.raises(ValueError, match=r"bad.jsonl:2: not valid JSON"):
        read_rows([bad])
    with pytest.raises(ValueError, match=r"does not exist \(make rows with `my-app prepare-data`\)"):
        read_rows([tmp_path / "missing.jsonl"], made_by="my-app prepare-data")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(ValueError, match="holds no rows"):
        read_rows([empty])


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--n", "0"], ["--n 0"]),
        (["--top-p", "1.5"], ["--top-p 1.5"]),
        (["--n", "0", "--top-p", "1.5"], ["--n 0", "--top-p 1.5"]),
        (["--score-timeout", "0"], ["--score-timeout 0"]),
        (["--n", "2", "--k", "4"], ["--k [4]"]),
    ],
)
def test_bad_flags_are_named_as_flags(flags: list[str], named: list[str]) -> None:
    parser = argparse.ArgumentParser()
    add_eval_arguments(parser)
    with pytest.raises(ValueError) as caught:
        settings_from_args(parser.parse_args(flags))
    message = str(caught.value)
    assert all(flag in message for flag in named), message
    assert "pydantic" not in message and "top_p" not in message and "validation error" not in message
    assert "\n" not in message  # one line for parser.error


def test_greedy_with_several_samples_is_warned() -> None:
    assert sampling_warnings(EvalSettings(n=4, temperature=0.0))[0].startswith("--temperature 0 is greedy")
    assert sampling_warnings(EvalSettings(n=1, temperature=0.0)) == []
    assert sampling_warnings(EvalSettings(n=4, temperature=0.6)) == []


def test_scoring_errors_are_announced_on_the_console(capsys: pytest.CaptureFixture[str]) -> None:
    rows = [{**gsm8k_row("7"), "data_source": "no_such_source"}, gsm8k_row("12")]
    settings = EvalSettings(n=2, score_workers=0)
    result = run_eval(
        ScriptedSampler([["#### 7"] * 2, ["#### 12"] * 2]), rows, settings, lambda i, r: (i, 2), progress=False
    )
    report(result, rows, settings, None)
    err = capsys.readouterr().err
    assert "WARNING: 2 of 4 samples had scoring errors" in err
    assert err.count("no_such_source") == 1  # distinct messages, once each
    capsys.readouterr()
    clean = run_eval(ScriptedSampler([["#### 12"] * 2]), rows[1:], settings, lambda i, r: (i, 2), progress=False)
    report(clean, rows[1:], settings, None)
    assert "WARNING" not in capsys.readouterr().err
