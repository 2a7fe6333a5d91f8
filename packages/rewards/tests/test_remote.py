"""RemoteReward against a real local reward server speaking OpenRLHF's protocol (FastAPI + uvicorn in a thread).

The server's reward rule is one the test can recompute: reward = len(query) % 7, score = 1.0 when the label
occurs in the query, and extra_logs carry the query length and a text note. Routes select behaviours; `{key}`
keeps each test's call counters apart.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from typing import Any

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from rlloom.rewards.http_retry import retry_after_seconds
from rlloom.rewards.remote import RemoteReward, RemoteRewardConfig, RemoteRewardError, RemoteSample
from rlloom.rewards.rubric import Rubric

CALLS: defaultdict[str, list[dict[str, Any]]] = defaultdict(list)  # key -> bodies received, in arrival order
TIMES: defaultdict[str, list[float]] = defaultdict(list)  # key -> arrival times
IN_FLIGHT = {"now": 0, "max": 0}


def rule(query: str) -> int:
    return len(query) % 7


def openrlhf_reply(body: dict[str, Any]) -> dict[str, Any]:
    queries, labels = body["query"], body["labels"]
    return {
        "rewards": [rule(q) for q in queries],
        "scores": [1.0 if str(label) in q else 0.0 for q, label in zip(queries, labels, strict=True)],
        "extra_logs": {"qlen": [len(q) for q in queries], "note": [f"n{len(q)}" for q in queries]},
    }


def make_app() -> FastAPI:
    app = FastAPI()

    @app.post("/{behaviour}/{key}")
    async def reward(behaviour: str, key: str, request: Request) -> Any:
        body = await request.json()
        CALLS[key].append(body)
        TIMES[key].append(time.monotonic())
        n_calls = len(CALLS[key])
        queries = body.get("query", [])
        if behaviour == "ok":
            IN_FLIGHT["now"] += 1
            IN_FLIGHT["max"] = max(IN_FLIGHT["max"], IN_FLIGHT["now"])
            try:  # uneven delays, so batches finish out of order
                await asyncio.sleep(0.03 * (len(queries[0]) % 4) if queries else 0)
            finally:
                IN_FLIGHT["now"] -= 1
            return openrlhf_reply(body)
        if behaviour == "flaky":  # 503 on the first call, then fine
            if n_calls == 1:
                return JSONResponse({"error": "warming up"}, status_code=503)
            return openrlhf_reply(body)
        if behaviour == "throttled":  # 429 with Retry-After on the first call
            if n_calls == 1:
                return JSONResponse({"error": "slow down"}, status_code=429, headers={"Retry-After": "1"})
            return openrlhf_reply(body)
        if behaviour == "down":
            return JSONResponse({"error": "down"}, status_code=503)
        if behaviour == "refuse":
            return JSONResponse({"error": "bad request"}, status_code=400)
        if behaviour == "short":
            return {"rewards": [rule(q) for q in queries][:-1]}
        if behaviour == "missing":
            return {"reward": [rule(q) for q in queries]}
        if behaviour == "html":
            return Response("<html>502 Bad Gateway</html>", media_type="text/html")
        if behaviour == "badlogs":
            return {"rewards": [rule(q) for q in queries], "extra_logs": {"qlen": [1]}}
        if behaviour == "nan":  # JSONResponse refuses NaN; write the JSON text by hand
            values = ["NaN", "null", '"high"', "Infinity", *[str(rule(q)) for q in queries[4:]]]
            return Response('{"rewards": [' + ", ".join(values) + "]}", media_type="application/json")
        if behaviour == "slow":
            await asyncio.sleep(2.0)
            return openrlhf_reply(body)
        if behaviour == "custom":  # other field names, and the extra body fields echoed
            texts = body["texts"]
            return {"values": [rule(t) for t in texts], "model_seen": body["model"]}
        raise AssertionError(behaviour)

    return app


@pytest.fixture(scope="module")
def server_url(serve_app: Any) -> Iterator[str]:
    with serve_app(make_app()) as url:
        yield url


@dataclass
class Traj:  # the fields of core-rl's Trajectory that the remote reward reads
    response_text: Any
    ground_truth: Any = None
    prompt_text: str = ""
    prompt_messages: list[dict[str, Any]] | None = None
    extra_info: dict[str, Any] = field(default_factory=dict)


def remote(url: str, behaviour: str, key: str, **kw: Any) -> RemoteReward:
    return RemoteReward(RemoteRewardConfig(url=f"{url}/{behaviour}/{key}", backoff=0.01, **kw))


def samples(n: int) -> list[Traj]:
    """Distinct lengths, so a reward given to the wrong sample would show."""
    return [Traj(response_text="r" * (3 * i + 1), ground_truth=str(i), prompt_text=f"Q{i}: ") for i in range(n)]


def test_rewards_align_across_batches_and_concurrency(server_url: str) -> None:
    trajs = samples(23)
    IN_FLIGHT["max"] = 0
    reward = remote(server_url, "ok", "align", batch_size=4, max_concurrency=3)
    results = reward(trajs)
    assert len(results) == 23
    for traj, result in zip(trajs, results, strict=True):
        query = traj.prompt_text + traj.response_text
        assert result.error is None
        assert result.score == rule(query)
        assert result.components == {"scores": 1.0 if str(traj.ground_truth) in query else 0.0, "qlen": len(query)}
        assert result.details == {"extra": {"note": f"n{len(query)}"}}  # text is kept, not a component
    bodies = CALLS["align"]
    assert sorted(len(b["query"]) for b in bodies) == [3, 4, 4, 4, 4, 4]  # ceil(23 / 4) POSTs
    sent = sorted((q for b in bodies for q in b["query"]), key=len)
    assert sent == [t.prompt_text + t.response_text for t in trajs]
    assert all(b["prompts"] == [q.split(" ")[0] + " " for q in b["query"]] for b in bodies)
    assert 2 <= IN_FLIGHT["max"] <= 3


def test_async_entry_point_and_dict_samples(server_url: str) -> None:
    reward = remote(server_url, "ok", "async", batch_size=2, component_prefix="rm/")
    items: list[Any] = [
        {"prompt": "a", "response": "bcd", "label": "c"},
        RemoteSample(prompt="", response="xyzzy", label="q"),
        {"response": "only"},
    ]
    results = asyncio.run(reward.ascore(items))
    assert [r.score for r in results] == [4 % 7, 5 % 7, 4 % 7]
    assert results[0].components == {"rm/scores": 1.0, "rm/qlen": 4.0}
    # the two batches are sent concurrently, so the server may see either first: find the one-sample batch
    assert [c["labels"] for c in CALLS["async"] if len(c["labels"]) == 1] == [[None]]


def test_sync_call_inside_a_running_event_loop(server_url: str) -> None:
    reward = remote(server_url, "ok", "inloop")

    async def main() -> list[float]:
        return [r.score for r in reward(samples(3))]  # a sync reward_fn called from async code

    assert asyncio.run(main()) == [rule(t.prompt_text + t.response_text) for t in samples(3)]


def test_prompt_from_messages_renderer_and_response_only_query(server_url: str) -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}]
    traj = Traj(response_text="4", ground_truth="4", prompt_messages=messages)
    remote(server_url, "ok", "messages")([traj])
    assert CALLS["messages"][0]["prompts"] == ["Be brief.\n2+2?"]
    assert CALLS["messages"][0]["query"] == ["Be brief.\n2+2?4"]

    def render(t: Any) -> str:
        return "".join(f"<|{m['role']}|>{m['content']}" for m in t.prompt_messages) + "<|assistant|>"

    RemoteReward(RemoteRewardConfig(url=f"{server_url}/ok/rendered"), prompt_renderer=render)([traj])
    assert CALLS["rendered"][0]["query"] == ["<|system|>Be brief.<|user|>2+2?<|assistant|>4"]

    remote(server_url, "ok", "responseonly", query="response", prompts_key=None)([traj])
    assert CALLS["responseonly"][0] == {"query": ["4"], "labels": ["4"]}


def test_configurable_field_names_and_extra_body(server_url: str) -> None:
    reward = remote(
        server_url, "custom", "custom", query_key="texts", reward_key="values", score_key=None, extra_key=None,
        extra_body={"model": "rm-7b"},
    )  # fmt: skip
    results = reward([RemoteSample(response="hello")])
    assert results[0].score == 5 and results[0].components == {}
    assert CALLS["custom"][0]["model"] == "rm-7b"


def test_retries_after_503_then_succeeds(server_url: str) -> None:
    reward = remote(server_url, "flaky", "flaky")
    results = reward(samples(3))
    assert [r.error for r in results] == [None, None, None]
    assert [r.score for r in results] == [rule(t.prompt_text + t.response_text) for t in samples(3)]
    assert len(CALLS["flaky"]) == 2 and reward.stats["retries"] == 1


def test_retry_after_is_honoured(server_url: str) -> None:
    reward = remote(server_url, "throttled", "throttled")  # backoff 0.01 s, Retry-After 1 s
    results = reward(samples(2))
    assert all(r.error is None for r in results)
    first, second = TIMES["throttled"]
    assert second - first >= 0.9


def test_retry_after_parsing() -> None:
    now = datetime(2025, 1, 1, 12, 0, 0, tzinfo=UTC)
    assert retry_after_seconds("3") == 3.0
    assert retry_after_seconds(format_datetime(now + timedelta(seconds=30), usegmt=True), now=now) == 30.0
    assert retry_after_seconds(format_datetime(now - timedelta(seconds=30), usegmt=True), now=now) == 0.0
    assert retry_after_seconds("soon") is None and retry_after_seconds(None) is None


def test_gives_up_after_retries_and_does_not_retry_4xx(server_url: str) -> None:
    down = remote(server_url, "down", "down", max_retries=2)
    results = down(samples(3))
    assert len(CALLS["down"]) == 3
    for r in results:
        assert r.score == 0.0 and r.details["error_kind"] == "remote"
        assert r.error and "/down/down" in r.error and "3 attempt(s)" in r.error and "HTTP 503" in r.error
    refused = remote(server_url, "refuse", "refuse")(samples(1))
    assert len(CALLS["refuse"]) == 1
    assert refused[0].error and "HTTP 400 (not retried)" in refused[0].error


def test_connection_refused_is_retried_then_reported() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # nothing listens here once closed
    reward = RemoteReward(RemoteRewardConfig(url=f"http://127.0.0.1:{port}/r", max_retries=1, backoff=0.01))
    result = reward(samples(1))[0]
    assert result.error and "connection error" in result.error and f"127.0.0.1:{port}" in result.error
    assert reward.stats == {"requests": 2, "retries": 1, "failed_batches": 1}


def test_wrong_length_fails_the_whole_batch_only(server_url: str) -> None:
    results = remote(server_url, "short", "short", batch_size=3)(samples(5))
    assert all(r.score == 0.0 for r in results)
    assert results[0].error == (
        f"{server_url}/short/short: 'rewards' has 2 values for a batch of 3 samples; cannot tell which is whose"
    )
    assert results[3].error and "has 1 values for a batch of 2" in results[3].error
    bad_logs = remote(server_url, "badlogs", "badlogs")(samples(2))
    assert bad_logs[1].error and "'extra_logs.qlen' has 1 values for a batch of 2 samples" in bad_logs[1].error


def test_missing_field_and_non_json(server_url: str) -> None:
    missing = remote(server_url, "missing", "missing")(samples(2))
    assert missing[0].error == f"{server_url}/missing/missing: the reply has no 'rewards' field (fields: 'reward')"
    html = remote(server_url, "html", "html")(samples(2))
    assert html[1].error and html[1].error.startswith(f"{server_url}/html/html: the reply is not JSON (HTTP 200")
    assert len(CALLS["html"]) == 1  # a reply out of protocol is not retried


def test_non_finite_or_non_numeric_rewards_fail_their_sample(server_url: str) -> None:
    trajs = samples(6)
    results = remote(server_url, "nan", "nan")(trajs)
    url = f"{server_url}/nan/nan"
    assert results[0].error == f"{url}: 'rewards' for sample 0 is nan (not finite)"
    assert results[1].error == f"{url}: 'rewards' for sample 1 is None (not a number)"
    assert results[2].error == f"{url}: 'rewards' for sample 2 is 'high' (not a number)"
    assert results[3].error == f"{url}: 'rewards' for sample 3 is inf (not finite)"
    assert [r.score for r in results] == [0.0] * 4 + [rule(t.prompt_text + t.response_text) for t in trajs[4:]]
    assert results[4].error is None and results[5].error is None


def test_timeout(server_url: str) -> None:
    reward = remote(server_url, "slow", "slow", timeout=0.3, max_retries=1)
    start = time.monotonic()
    result = reward(samples(1))[0]
    assert time.monotonic() - start < 1.9  # two 0.3 s attempts, not the server's 2 s
    assert result.error and "timed out after 0.3 s" in result.error and "2 attempt(s)" in result.error


def test_on_error_raise(server_url: str) -> None:
    reward = remote(server_url, "missing", "raise", on_error="raise", batch_size=1, max_concurrency=2)
    with pytest.raises(RemoteRewardError, match="no 'rewards' field"):
        reward(samples(4))


def test_bad_inputs() -> None:
    reward = RemoteReward("http://127.0.0.1:9/never-called")
    not_text = reward([Traj(response_text=None)])[0]
    assert not_text.error == "response must be a str (the model's output text), got NoneType"
    assert not_text.details["error_kind"] == "input"
    with pytest.raises(ValueError, match=r"samples\[1\] is invalid"):
        reward([RemoteSample(response="a"), {"prompt": "no response"}])
    with pytest.raises(TypeError, match=r"samples\[0\] is a int"):
        reward([3])
    with pytest.raises(ValueError, match="http:// or https://"):
        RemoteRewardConfig(url="127.0.0.1:5000/get_reward")
    assert reward([]) == []


def test_as_a_rubric_term(server_url: str) -> None:
    reward = remote(server_url, "ok", "rubric")
    rubric = Rubric([("rm", reward.score_response, 0.5), ("echo", lambda r, g, **_: float(r == g), 1.0)])
    result = asyncio.run(rubric.ascore("abc", "abc", extra_info={"prompt": "Q: "}))
    assert result.score == 0.5 * rule("Q: abc") + 1.0
    assert result.components["rm"] == rule("Q: abc") and result.components["rm/qlen"] == 6.0
    assert json.loads(json.dumps(CALLS["rubric"][0])) == {"query": ["Q: abc"], "prompts": ["Q: "], "labels": ["abc"]}
