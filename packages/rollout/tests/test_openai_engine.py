"""OpenAIEngine against this package's real server, and its retry/error behaviour."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import httpx
import pytest

from rlloom.core_rl.contracts.generation import GenerationRequest, SamplingParams
from rlloom.rollout.hf.engine import HFEngine
from rlloom.rollout.openai.engine import OpenAIEngine, OpenAIEngineConfig, OpenAIEngineError


def _remote(served: Any, **kw: Any) -> OpenAIEngine:
    return OpenAIEngine(OpenAIEngineConfig(base_url=served.base_url, model="tiny", **kw))


def test_token_prompts_round_trip_exact_ids_and_logprobs(served: Any, engine: HFEngine, encode: Any) -> None:
    reqs = [
        GenerationRequest(prompt_ids=encode(p), sampling=SamplingParams(n=2, seed=i, max_tokens=10, stop=["e"]))
        for i, p in enumerate(["alpha", "beta gamma"])
    ]
    remote = _remote(served).generate(reqs)
    local = engine.generate(reqs)
    for r_list, l_list in zip(remote, local, strict=True):
        for r, c in zip(r_list, l_list, strict=True):
            assert r.token_ids == c.token_ids and r.text == c.text and r.prompt_ids == c.prompt_ids
            assert r.finish_reason == c.finish_reason
            assert r.logprobs == pytest.approx(c.logprobs, abs=1e-5)


def test_chat_prompts_use_the_chat_endpoint(served: Any, engine: HFEngine) -> None:
    req = GenerationRequest(messages=[{"role": "user", "content": "hi"}], sampling=SamplingParams(seed=4, max_tokens=8))
    [r] = _remote(served).generate([req])[0]
    [c] = engine.generate([req])[0]
    assert (r.text, r.token_ids, r.prompt_ids) == (c.text, c.token_ids, c.prompt_ids)


def test_chat_template_kwargs_reach_the_servers_template(served: Any, engine: HFEngine, tok: Any) -> None:
    """vLLM's chat_template_kwargs field (Qwen3's enable_thinking): rendered by the server's template, as
    HFEngine renders it; a hosted API (no vLLM extensions) cannot take it, so it is refused, not dropped."""
    tok.chat_template += "{% if style is defined %}{{ style }}{% endif %}"
    messages = [{"role": "user", "content": "hi"}]
    req = GenerationRequest(
        messages=messages, sampling=SamplingParams(seed=4, max_tokens=6), chat_template_kwargs={"style": "brief:"}
    )
    [r] = _remote(served).generate([req])[0]
    assert tok.decode(r.prompt_ids) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nbrief:"
    [c] = engine.generate([req])[0]
    assert (r.prompt_ids, r.token_ids) == (c.prompt_ids, c.token_ids)
    with pytest.raises(ValueError, match=r"chat_template_kwargs \(style\) cannot be sent"):
        _remote(served, vllm_extensions=False).generate([req])


def test_concurrent_agenerate_calls(served: Any, encode: Any) -> None:
    remote = _remote(served, max_concurrency=4)

    async def run() -> list[Any]:
        reqs = [GenerationRequest(prompt_ids=encode(f"q{i}"), sampling=SamplingParams(max_tokens=6)) for i in range(12)]
        try:
            return await asyncio.gather(*(remote.agenerate(r) for r in reqs))
        finally:
            await remote.aclose()

    out = asyncio.run(run())
    assert len(out) == 12 and all(len(o) == 1 and 1 <= len(o[0].token_ids) <= 6 for o in out)


def test_retries_server_errors_then_succeeds(served: Any, encode: Any) -> None:
    calls = {"n": 0}

    def flaky(request: httpx.Request) -> httpx.Response:  # the first two tries hit an overloaded server
        calls["n"] += 1
        if calls["n"] <= 2:
            return httpx.Response(503, json={"error": {"message": "overloaded"}})
        real = httpx.post(str(request.url), content=request.content, headers=dict(request.headers), timeout=30)
        return httpx.Response(real.status_code, content=real.content, headers=real.headers)

    remote = OpenAIEngine(
        OpenAIEngineConfig(base_url=served.base_url, model="tiny", backoff_s=0.01), transport=httpx.MockTransport(flaky)
    )
    [[c]] = remote.generate([GenerationRequest(prompt_ids=encode("x"), sampling=SamplingParams(max_tokens=4))])
    assert calls["n"] == 3 and len(c.token_ids) >= 1


def test_client_errors_fail_fast_with_the_server_message(served: Any, encode: Any) -> None:
    remote = OpenAIEngine(OpenAIEngineConfig(base_url=served.base_url, model="nope", backoff_s=0.01))
    with pytest.raises(OpenAIEngineError, match="not served"):
        remote.generate([GenerationRequest(prompt_ids=encode("x"))])


def test_unreachable_server_gives_up_after_retries(encode: Any) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = OpenAIEngineConfig(base_url=f"http://127.0.0.1:{port}/v1", model="m", max_retries=2, backoff_s=0.01)
    with pytest.raises(OpenAIEngineError, match="after 3 tries"):
        OpenAIEngine(cfg).generate([GenerationRequest(prompt_ids=encode("x"))])


def test_weight_push_to_a_server_that_is_gone_names_the_url(tok: Any, peaked_state: Any) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = OpenAIEngineConfig(base_url=f"http://127.0.0.1:{port}/v1", model="m")
    with pytest.raises(OpenAIEngineError, match=f"127.0.0.1:{port}/v1/update_weights failed .*ConnectError"):
        OpenAIEngine(cfg).update_weights(peaked_state(tok, seed=1))


def test_context_window_is_read_from_the_server_once(served: Any, model: Any) -> None:
    remote = _remote(served)
    assert remote.context_window == model.config.max_position_embeddings
    served.server.should_exit = True  # a second read must not go back to the server
    served.thread.join(timeout=10)
    assert remote.context_window == model.config.max_position_embeddings


def test_context_window_set_or_turned_off_never_asks(encode: Any) -> None:
    asked: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        asked.append(request.url.path)
        return httpx.Response(200, json={"data": [{"id": "m", "max_model_len": 4096}]})

    base = {"base_url": "http://server/v1", "model": "m"}
    transport = httpx.MockTransport(handler)
    assert OpenAIEngine(OpenAIEngineConfig(**base, context_window=300), transport).context_window == 300
    assert OpenAIEngine(OpenAIEngineConfig(**base, context_window=None), transport).context_window is None
    assert asked == []
    assert OpenAIEngine(OpenAIEngineConfig(**base), transport).context_window == 4096
    assert asked == ["/v1/models"]
    with pytest.raises(ValueError, match="context_window must be at least 2"):
        OpenAIEngineConfig(**base, context_window=1)


def test_context_window_unknown_when_the_server_does_not_say() -> None:
    hosted = httpx.MockTransport(lambda r: httpx.Response(200, json={"data": [{"id": "m", "object": "model"}]}))
    cfg = OpenAIEngineConfig(base_url="http://server/v1", model="m")
    assert OpenAIEngine(cfg, hosted).context_window is None
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    gone = OpenAIEngine(OpenAIEngineConfig(base_url=f"http://127.0.0.1:{port}/v1", model="m"))
    with pytest.warns(UserWarning, match="set OpenAIEngineConfig.context_window"):
        assert gone.context_window is None


def test_update_weights_pushes_to_the_server(served: Any, tok: Any, encode: Any, peaked_state: Any) -> None:
    remote = _remote(served)
    req = GenerationRequest(prompt_ids=encode("abc"), sampling=SamplingParams(seed=2, max_tokens=12, ignore_eos=True))
    before = remote.generate([req])[0][0]
    remote.update_weights(peaked_state(tok, seed=5))
    after = remote.generate([req])[0][0]
    assert after.logprobs != before.logprobs and after.token_ids != before.token_ids


@pytest.mark.parametrize(
    ("knob", "value"), [("top_k", 5), ("min_p", 0.1), ("stop_token_ids", [3]), ("ignore_eos", True)]
)
def test_knobs_a_plain_openai_api_cannot_take_are_refused_not_dropped(
    served: Any, encode: Any, knob: str, value: Any
) -> None:
    """With vllm_extensions=False these fields were left out of the body: the server sampled without them."""
    plain = _remote(served, vllm_extensions=False, max_retries=0)
    sampling = SamplingParams(max_tokens=4, seed=0, **{knob: value})
    with pytest.raises(ValueError, match=rf"SamplingParams\.{knob} cannot be sent .*vllm_extensions=True"):
        plain.generate([GenerationRequest(prompt_ids=encode("abc"), sampling=sampling)])
    ok = plain.generate([GenerationRequest(prompt_ids=encode("abc"), sampling=SamplingParams(max_tokens=4, seed=0))])
    assert len(ok[0][0].token_ids) >= 1
