"""LLM judge against a real local HTTP server speaking the OpenAI chat-completions protocol (FastAPI + uvicorn).

The server's "model" grades by a rule we can predict: CORRECT iff the reference answer, lower-cased, occurs in
the response section of the prompt. Route prefixes select behaviours: /ok, /flaky (503 twice, then fine),
/slow (sleeps past the client timeout), /junk (no verdict line), /bad (HTTP 400), /score (SCORE line).
"""

from __future__ import annotations

import asyncio
import re
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from rlloom.rewards.judge import JudgeConfig, LLMJudge, cache_key, parse_verdict
from rlloom.rewards.rubric import Rubric

CALLS: Counter[str] = Counter()


def _completion(content: str, model: str) -> dict[str, Any]:
    return {
        "id": "chatcmpl-test", "object": "chat.completion", "created": int(time.time()), "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }  # fmt: skip


def _grade(prompt: str) -> bool:
    reference = re.search(r"Reference answer: (.*)", prompt)
    response = re.search(r"Response to grade: (.*?)\n\n", prompt, re.DOTALL)
    assert reference and response, prompt
    aliases = reference.group(1).strip().lower().split(" or ")
    return any(alias in response.group(1).lower() for alias in aliases)


def make_app() -> FastAPI:
    app = FastAPI()

    @app.post("/{behaviour}/v1/chat/completions")
    async def chat(behaviour: str, request: Request) -> Any:
        body = await request.json()
        CALLS[behaviour] += 1
        prompt = body["messages"][-1]["content"]
        if behaviour == "flaky" and CALLS[behaviour] % 3 != 0:
            return JSONResponse({"error": "overloaded"}, status_code=503)
        if behaviour == "slow":
            await asyncio.sleep(2.0)
        if behaviour == "bad":
            return JSONResponse({"error": {"message": "model not found"}}, status_code=400)
        if behaviour == "junk":
            return _completion("I think it is probably fine?", body["model"])
        if behaviour == "score":
            return _completion(f"Reasoning...\nSCORE: {8 if _grade(prompt) else 2}", body["model"])
        verdict = "CORRECT" if _grade(prompt) else "INCORRECT"
        return _completion(f"Let me compare. VERDICT: maybe\n**VERDICT: {verdict}**", body["model"])

    return app


@pytest.fixture(scope="module")
def server_url(serve_app: Any) -> Iterator[str]:
    with serve_app(make_app()) as url:
        yield url


def judge(url: str, behaviour: str, **kw: Any) -> LLMJudge:
    return LLMJudge(JudgeConfig(base_url=f"{url}/{behaviour}/v1", model="grader", backoff=0.01, **kw))


def test_parse_verdict() -> None:
    assert parse_verdict("VERDICT: INCORRECT ... actually VERDICT: correct") == (1.0, None)
    assert parse_verdict("**Verdict:** INCORRECT") == (0.0, None)
    score, error = parse_verdict("looks right to me")
    assert score == 0.0 and error and "VERDICT" in error
    assert parse_verdict("SCORE: 7/10", "score") == (0.7, None)
    assert parse_verdict("SCORE: 42", "score")[1] == "judge score 42 is outside 0-10"
    assert parse_verdict("no number", "score")[0] == 0.0


def test_cache_key_depends_on_every_field() -> None:
    base = {"model": "m", "messages": [{"role": "user", "content": "q"}], "temperature": 0.0, "max_tokens": 8}
    assert cache_key(base) == cache_key(dict(reversed(base.items())))
    for field, value in [("model", "m2"), ("temperature", 0.5), ("max_tokens", 9), ("messages", [])]:
        assert cache_key({**base, field: value}) != cache_key(base)


def test_verdicts_and_cache_hits(server_url: str) -> None:
    j = judge(server_url, "ok")

    async def main() -> list[Any]:
        right = await j("After some thought, the answer is Paris.", "Paris", extra_info={"question": "Capital?"})
        wrong = await j("It is Lyon.", "Paris")
        again = await j("After some thought, the answer is Paris.", "Paris", extra_info={"question": "Capital?"})
        await j.aclose()
        return [right, wrong, again]

    before = CALLS["ok"]
    right, wrong, again = asyncio.run(main())
    assert (right.score, wrong.score, again.score) == (1.0, 0.0, 1.0)
    assert right.details["cached"] is False and again.details["cached"] is True
    assert CALLS["ok"] - before == 2 and j.stats["cache_hits"] == 1


def test_disk_cache_survives_a_new_judge(server_url: str, tmp_path: Path) -> None:
    before = CALLS["ok"]
    first = asyncio.run(judge(server_url, "ok", cache_dir=tmp_path)("Rome!", "rome"))
    second = asyncio.run(judge(server_url, "ok", cache_dir=tmp_path)("Rome!", "rome"))
    assert first.score == second.score == 1.0 and second.details["cached"] is True
    assert CALLS["ok"] - before == 1 and len(list(tmp_path.glob("*.json"))) == 1


def test_flaky_endpoint_is_retried(server_url: str) -> None:
    CALLS["flaky"] = 0
    j = judge(server_url, "flaky")
    result = asyncio.run(j("Paris", "Paris"))
    assert result.score == 1.0 and result.error is None
    assert CALLS["flaky"] == 3 and j.stats["retries"] == 2


def test_slow_endpoint_times_out_with_bounded_time(server_url: str) -> None:
    j = judge(server_url, "slow", timeout=0.3, max_retries=1)
    start = time.monotonic()
    result = asyncio.run(j("Paris", "Paris"))
    elapsed = time.monotonic() - start
    assert result.score == 0.0 and result.error and "timed out after 0.3 s" in result.error
    assert "after 2 attempts" in result.error
    assert elapsed < 2 * 0.3 + 0.01 + 1.5  # two attempts plus backoff, never the server's 2 s per request


def test_junk_bad_and_empty_replies_score_zero_with_reasons(server_url: str) -> None:
    junk = asyncio.run(judge(server_url, "junk")("Paris", "Paris"))
    assert junk.score == 0.0 and "no 'VERDICT" in (junk.error or "")
    bad = asyncio.run(judge(server_url, "bad")("Paris", "Paris"))
    assert bad.score == 0.0 and "HTTP 400" in (bad.error or "") and "model not found" in (bad.error or "")
    before = sum(CALLS.values())
    empty = asyncio.run(judge(server_url, "ok")("   ", "Paris"))
    assert empty.score == 0.0 and "empty response" in (empty.error or "") and sum(CALLS.values()) == before


def test_unreachable_endpoint_reports_connection_error() -> None:
    j = LLMJudge(JudgeConfig(base_url="http://127.0.0.1:9/v1", model="m", max_retries=1, backoff=0.01, timeout=2))
    result = asyncio.run(j("Paris", "Paris"))
    assert result.score == 0.0 and "connection error" in (result.error or "")


def test_score_mode_and_inside_a_rubric(server_url: str) -> None:
    j = judge(server_url, "score", mode="score")
    assert asyncio.run(j("It's Paris", "paris")).score == pytest.approx(0.8)
    assert asyncio.run(j("It's Paris", {"target": ["Lutetia", "Paris"]})).score == pytest.approx(0.8)
    rubric = Rubric([("judge", j, 0.5), ("em", "qa_em", 0.5)])
    result = asyncio.run(rubric.ascore("<answer>Paris</answer>", ["Paris"]))
    assert result.components["judge"] == pytest.approx(0.8) and result.components["em"] == 1.0
    assert result.score == pytest.approx(0.5 * 0.8 + 0.5 * 1.0)
    assert rubric("<answer>Lyon</answer>", ["Paris"]).score == pytest.approx(0.5 * 0.2)  # sync path runs the judge too


def test_a_long_response_keeps_its_final_answer(server_url: str) -> None:
    reasoning = "Let me think about the capitals of Europe step by step. " * 600  # ~34k chars, over the 20k cap
    result = asyncio.run(judge(server_url, "ok")(reasoning + "So the final answer is Paris.", "Paris"))
    assert result.details["truncated"] is True
    assert result.score == 1.0, "the judge must see the tail, where a chain of thought states its answer"


def test_parquet_ground_truth_and_non_text_responses(server_url: str) -> None:
    np = pytest.importorskip("numpy")
    j = judge(server_url, "ok")
    messages = j.build_messages("Paris", "x")
    assert "Reference answer: x" in messages[0]["content"]
    aliases = {"target": np.array(["Lutetia", "Paris"], dtype=object)}  # a Search-R1 parquet row
    result = asyncio.run(j("The answer is Paris.", aliases))
    assert result.score == 1.0 and result.error is None
    not_text = asyncio.run(j(["Paris"], "Paris"))  # type: ignore[arg-type]
    assert not_text.score == 0.0 and "response must be a str" in (not_text.error or "")
    assert asyncio.run(j(b"It is Paris", "Paris")).score == 1.0
