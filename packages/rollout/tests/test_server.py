"""The OpenAI-compatible server answering the official `openai` client over real HTTP."""

from __future__ import annotations

import io
import time
from typing import Any

import httpx
import openai
import pytest
import torch
from safetensors.torch import save

from rlloom.core_rl.contracts.generation import GenerationRequest, SamplingParams
from rlloom.core_rl.tiny import tiny_qwen2
from rlloom.rollout.hf.engine import HFEngine


def _client(served: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=served.base_url, api_key="unused", max_retries=0, timeout=60)


def test_models_lists_the_served_name(served: Any) -> None:
    assert [m.id for m in _client(served).models.list()] == ["tiny"]


def test_models_report_the_context_length_as_vllm_does(served: Any, model: torch.nn.Module) -> None:
    [card] = httpx.get(f"{served.base_url}/models").json()["data"]
    assert card["max_model_len"] == model.config.max_position_embeddings


def test_chat_completion_matches_the_engine(served: Any, engine: HFEngine) -> None:
    messages = [{"role": "user", "content": "hello"}]
    resp = _client(served).chat.completions.create(
        model="tiny", messages=messages, max_tokens=12, seed=5, n=2, logprobs=True, extra_body={"ignore_eos": True}
    )
    direct = engine.generate(
        [GenerationRequest(messages=messages, sampling=SamplingParams(max_tokens=12, seed=5, n=2, ignore_eos=True))]
    )[0]
    assert [c.message.content for c in resp.choices] == [c.text for c in direct]
    assert resp.choices[0].finish_reason == "length"
    lps = [t.logprob for t in resp.choices[0].logprobs.content]
    assert lps == pytest.approx(direct[0].logprobs, abs=1e-5)
    assert resp.usage.completion_tokens == 24


def test_completion_with_token_ids_and_stop(served: Any, engine: HFEngine, encode: Any) -> None:
    prompt = encode("count: ")
    resp = _client(served).completions.create(
        model="tiny", prompt=prompt, max_tokens=20, seed=1, logprobs=1, extra_body={"ignore_eos": True}
    )
    text = resp.choices[0].text
    stop = text[4:6]
    cut = _client(served).completions.create(
        model="tiny", prompt=prompt, max_tokens=20, seed=1, stop=[stop], extra_body={"ignore_eos": True}
    )
    assert cut.choices[0].text == text[: text.find(stop)]  # OpenAI default: stop text not included
    assert cut.choices[0].finish_reason == "stop"
    extra = resp.choices[0].model_extra or {}
    assert extra["prompt_token_ids"] == prompt and len(extra["token_ids"]) == 20


def test_bad_requests_name_the_field_and_server_stays_up(served: Any) -> None:
    client = _client(served)
    with pytest.raises(openai.BadRequestError, match="temperature"):
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}], temperature=-1)
    with pytest.raises(openai.BadRequestError, match="frequency_penalty"):
        client.completions.create(model="tiny", prompt="x", frequency_penalty=0.5)
    with pytest.raises(openai.BadRequestError, match="bogus"):
        client.completions.create(model="tiny", prompt="x", extra_body={"bogus": 1})
    with pytest.raises(openai.NotFoundError, match="tiny"):
        client.completions.create(model="other", prompt="x")
    assert client.completions.create(model="tiny", prompt="still here", max_tokens=3).choices[0].text is not None


def test_weight_update_endpoint_changes_outputs(served: Any, tok: Any, tmp_path: Any, peaked_state: Any) -> None:
    client = _client(served)

    def sample() -> str:
        r = client.completions.create(
            model="tiny", prompt="abc", max_tokens=16, seed=3, extra_body={"ignore_eos": True}
        )
        return r.choices[0].text

    before = sample()
    new = peaked_state(tok, seed=99)
    r = httpx.post(
        served.base_url + "/update_weights",
        content=save(new),
        headers={"content-type": "application/octet-stream"},
        timeout=60,
    )
    assert r.status_code == 200 and r.json()["updated"] == len(new)
    after = sample()
    assert after != before
    # a path on the server's disk works too, and restores the first weights
    from safetensors.torch import save_file

    old = {k: v.contiguous() for k, v in tiny_qwen2(tok, seed=0).state_dict().items() if k != "lm_head.weight"}
    save_file(old, str(tmp_path / "model.safetensors"))
    r = httpx.post(served.base_url + "/update_weights", json={"path": str(tmp_path)}, timeout=60)
    assert r.status_code == 200
    assert sample() == before
    bad = httpx.post(served.base_url + "/update_weights", content=b"not safetensors", timeout=60)
    assert bad.status_code == 400 and "safetensors" in bad.json()["error"]["message"]
    buf = io.BytesIO(save({"model.norm.weight": torch.zeros(3)}))
    bad = httpx.post(served.base_url + "/update_weights", content=buf.getvalue(), timeout=60)
    assert bad.status_code == 400 and "model.norm.weight" in bad.json()["error"]["message"]


_USER = {"role": "user", "content": "x"}


class _FailingChatEngine:
    """The tiny engine, except that chat requests fail inside the engine (a bug, an OOM, a dead GPU)."""

    def __init__(self, engine: HFEngine) -> None:
        self.engine = engine
        self.context_window = engine.context_window

    async def agenerate(self, request: GenerationRequest) -> list[Any]:
        if request.messages is not None:
            raise RuntimeError("boom")
        return await self.engine.agenerate(request)


def test_engine_failure_is_a_500_and_the_connection_stays_open(
    engine: HFEngine, tok: Any, server_thread: Any, caplog: pytest.LogCaptureFixture
) -> None:
    from rlloom.rollout.openai.server import create_app

    app = create_app(_FailingChatEngine(engine), "tiny", tok, default_max_tokens=4)  # type: ignore[arg-type]
    with server_thread(app) as srv, httpx.Client(base_url=srv.base_url, timeout=60) as http:
        failed = http.post("/chat/completions", json={"model": "tiny", "messages": [_USER]})
        failed_port = failed.extensions["network_stream"].get_extra_info("client_addr")
        time.sleep(0.3)  # time for the server to drop the connection, if it does
        answered = http.post("/completions", json={"model": "tiny", "prompt": "abc", "max_tokens": 2})
        answered_port = answered.extensions["network_stream"].get_extra_info("client_addr")
    assert failed.status_code == 500
    assert failed.json()["error"] == {
        "message": "the engine failed on this request: RuntimeError: boom",
        "type": "server_error",
        "param": None,
        "code": None,
    }
    assert answered.status_code == 200 and len(answered.json()["choices"][0]["token_ids"]) == 2
    assert answered_port == failed_port  # the keep-alive connection was reused, not reopened
    logged = [r for r in caplog.records if "boom" in r.getMessage()]
    assert len(logged) == 1 and logged[0].exc_info is None  # one line, no traceback


def test_reserved_chat_template_kwargs_are_a_400_naming_the_field(served: Any) -> None:
    body = {"model": "tiny", "messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": {"tokenize": 1}}
    r = httpx.post(f"{served.base_url}/chat/completions", json=body)
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "chat_template_kwargs" and "tokenize" in r.json()["error"]["message"]


def test_chat_text_parts_are_joined_as_vllm_does(served: Any) -> None:
    client = _client(served)

    def ask(content: Any) -> Any:
        return client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": content}], max_tokens=6, seed=2
        )

    parts = ask([{"type": "text", "text": "hel"}, {"type": "text", "text": "lo"}])
    joined = ask("hel\nlo")
    assert (parts.model_extra or {})["prompt_token_ids"] == (joined.model_extra or {})["prompt_token_ids"]
    assert parts.choices[0].message.content == joined.choices[0].message.content
    # an assistant turn that only called tools may leave its content null, as OpenAI allows
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    history = [{"role": "user", "content": "x"}, {"role": "assistant", "content": None, "tool_calls": [call]}]
    r = httpx.post(f"{served.base_url}/chat/completions", json={"model": "tiny", "messages": history}, timeout=60)
    assert r.status_code == 200


@pytest.mark.parametrize(
    ("message", "param", "says"),
    [
        ({"role": "user", "content": None}, "messages[0].content", "null"),
        ({"role": "user"}, "messages[0].content", "missing"),
        ({"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}, "messages[0].content",
         "images are not supported by this server"),
        ({"role": "user", "content": [{"type": "text"}]}, "messages[0].content", "not a text part"),
        ({"role": "wizard", "content": "x"}, "messages[0].role", "use one of system, user, assistant, tool"),
    ],
)  # fmt: skip
def test_bad_messages_are_400s_naming_the_field(served: Any, message: dict[str, Any], param: str, says: str) -> None:
    body = {"model": "tiny", "messages": [message]}
    r = httpx.post(f"{served.base_url}/chat/completions", json=body, timeout=60)
    assert r.status_code == 400
    assert r.json()["error"]["param"] == param and says in r.json()["error"]["message"]


@pytest.mark.parametrize(
    ("path", "extra", "param", "says"),
    [
        ("/completions", {"stream": True}, "stream", "send stream=false"),
        ("/completions", {"echo": True}, "echo", "send echo=false"),
        ("/completions", {"presence_penalty": 1.0}, "presence_penalty", "leave it at 0"),
        ("/completions", {"stop": [""]}, "stop", "empty stop strings"),
        ("/completions", {"stop": ""}, "stop", "empty stop strings"),
        ("/completions", {"logprobs": 5}, "logprobs", "only the sampled token's logprob is returned"),
        ("/chat/completions", {"top_logprobs": 2}, "top_logprobs", "only the sampled token's logprob is returned"),
        ("/completions", {"prompt": 5}, "prompt", "a list of token ids"),
        ("/completions", {"temperature": "hot"}, "temperature", "valid number"),
        ("/completions", {"bogus": 1}, "bogus", "not a field this server accepts"),
    ],
)
def test_unsupported_values_name_their_field(
    served: Any, path: str, extra: dict[str, Any], param: str, says: str
) -> None:
    base = {"model": "tiny", "prompt": "x"} if path == "/completions" else {"model": "tiny", "messages": [_USER]}
    r = httpx.post(f"{served.base_url}{path}", json={**base, **extra}, timeout=60)
    error = r.json()["error"]
    assert r.status_code == 400 and error["param"] == param and says in error["message"]
    assert error["message"].startswith(f"`{param}`: ") and "Value error" not in error["message"]
    assert "errors.pydantic.dev" not in r.text


def test_every_error_has_openai_shape(served: Any) -> None:
    with httpx.Client(base_url=served.base_url, timeout=60) as http:
        bad_json = http.post("/completions", content=b"{", headers={"content-type": "application/json"})
        no_route = http.get("/nope")
        wrong_method = http.get("/completions")
    assert bad_json.status_code == 400 and bad_json.json()["error"]["param"] is None
    assert "not valid JSON" in bad_json.json()["error"]["message"]
    assert no_route.status_code == 404 and "/v1/chat/completions" in no_route.json()["error"]["message"]
    assert wrong_method.status_code == 405 and "use POST" in wrong_method.json()["error"]["message"]
    for r in (bad_json, no_route, wrong_method):
        assert set(r.json()) == {"error"} and set(r.json()["error"]) == {"message", "type", "param", "code"}


def test_models_retrieve_returns_the_card_or_404(served: Any) -> None:
    client = _client(served)
    card = client.models.retrieve("tiny")
    assert card.id == "tiny" and (card.model_extra or {})["max_model_len"] == 1024
    with pytest.raises(openai.NotFoundError, match="use `tiny`"):
        client.models.retrieve("other")


def test_prompt_over_the_context_names_the_openai_field(served: Any, engine: HFEngine) -> None:
    window = engine.context_window
    assert window == 1024
    client = _client(served)
    with pytest.raises(openai.BadRequestError, match="1024 tokens, but the model's context is 1024") as info:
        client.completions.create(model="tiny", prompt=[5] * window, max_tokens=1)
    assert info.value.body["param"] == "prompt" and "prompt_ids" not in info.value.message  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "a" * window}])
    assert info.value.body["param"] == "messages" and "request" not in info.value.message  # type: ignore[index]
    # prompt + max_tokens over the context: the completion is capped at the room left (README)
    capped = client.completions.create(
        model="tiny", prompt=[5] * (window - 3), max_tokens=50, extra_body={"ignore_eos": True}
    )
    assert capped.choices[0].finish_reason == "length" and capped.usage.completion_tokens == 3


def test_chat_without_a_template_says_what_to_do(engine: HFEngine, tok: Any, server_thread: Any) -> None:
    import copy

    from rlloom.rollout.openai.server import create_app

    plain = copy.deepcopy(tok)
    plain.chat_template = None
    with server_thread(create_app(engine, "tiny", plain)) as srv:
        r = httpx.post(f"{srv.base_url}/chat/completions", json={"model": "tiny", "messages": [_USER]}, timeout=60)
    error = r.json()["error"]
    assert r.status_code == 400 and error["param"] == "messages"
    assert "--tokenizer" in error["message"] and "prompt_ids" not in error["message"]


@pytest.mark.parametrize(
    ("body", "says"),
    [({}, "required"), ({"path": 5}, "valid string"), ({"path": "GARBAGE"}, "is not a safetensors file")],
)
def test_update_weights_json_errors_name_path(served: Any, tmp_path: Any, body: dict[str, Any], says: str) -> None:
    garbage = tmp_path / "garbage.bin"
    garbage.write_bytes(b"not safetensors at all")
    body = {k: str(garbage) if v == "GARBAGE" else v for k, v in body.items()}
    r = httpx.post(f"{served.base_url}/update_weights", json=body, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "path" and says in r.json()["error"]["message"]
    assert "errors.pydantic.dev" not in r.text


def test_usage_counts_every_prompt_of_a_batched_completion(served: Any, encode: Any) -> None:
    """OpenAI/vLLM usage: each prompt's tokens once (not n times), summed over the prompts of the body."""
    prompts = ["ab", "abcdefgh", "xyz"]
    resp = _client(served).completions.create(model="tiny", prompt=prompts, max_tokens=3, n=2, seed=0)
    expected_prompt = sum(len(encode(p)) for p in prompts)  # 2 + 8 + 3 with the character tokenizer
    assert resp.usage.prompt_tokens == expected_prompt == 13
    completion = sum(len((c.model_extra or {})["token_ids"]) for c in resp.choices)
    assert len(resp.choices) == 6 and resp.usage.completion_tokens == completion
    assert resp.usage.total_tokens == expected_prompt + completion


# Qwen2.5's rendering of an assistant turn's tool calls (its chat template's `arguments | tojson`), on ChatML
TOOL_CALLS_TEMPLATE = (
    "{%- for m in messages %}{{- '<|im_start|>' + m.role + '\\n' + m.content }}"
    '{%- for c in m.tool_calls or [] %}{{- \'\\n<tool_call>\\n{"name": "\' + c.function.name + \'", "arguments": \' }}'
    "{{- c.function.arguments | tojson }}{{- '}\\n</tool_call>' }}{%- endfor %}{{- '<|im_end|>\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def test_tool_call_history_renders_arguments_as_objects_as_vllm_does(
    model: torch.nn.Module, tok: Any, server_thread: Any
) -> None:
    """OpenAI sends `function.arguments` as a JSON string; the template must get the object (vLLM parses it), or
    the prompt holds a double-encoded string the model never saw in training. Bad JSON is a 400 naming it."""
    import copy

    from rlloom.rollout.openai.server import create_app

    tools_tok = copy.deepcopy(tok)
    tools_tok.chat_template = TOOL_CALLS_TEMPLATE
    call = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}
    messages = [
        {"role": "user", "content": "2+3?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "5"},
    ]
    engine = HFEngine(model, tools_tok)
    try:
        with server_thread(create_app(engine, "tiny", tools_tok)) as srv:
            body = {"model": "tiny", "messages": messages, "max_tokens": 2}
            r = httpx.post(f"{srv.base_url}/chat/completions", json=body, timeout=60)
            assert r.status_code == 200, r.text
            prompt = tools_tok.decode(r.json()["prompt_token_ids"], skip_special_tokens=False)
            assert prompt == (
                "<|im_start|>user\n2+3?<|im_end|>\n"
                '<|im_start|>assistant\n\n<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
                "<|im_end|>\n<|im_start|>tool\n5<|im_end|>\n<|im_start|>assistant\n"
            )
            bad = {**call, "function": {"name": "add", "arguments": "{a: 2"}}
            body["messages"] = [messages[0], {**messages[1], "tool_calls": [bad]}, messages[2]]
            r = httpx.post(f"{srv.base_url}/chat/completions", json=body, timeout=60)
            assert r.status_code == 400
            assert r.json()["error"]["param"] == "messages[1].tool_calls[0].function.arguments"
    finally:
        engine.close()


def test_a_failing_prompt_cancels_the_other_prompts_of_its_body(
    model: torch.nn.Module, tok: Any, encode: Any, server_thread: Any
) -> None:
    """The body's second prompt is refused (400); its first must not go on decoding 1000 tokens nobody receives,
    holding the engine's one row while the next request waits."""
    from rlloom.rollout.hf.engine import HFEngineConfig
    from rlloom.rollout.openai.server import create_app

    engine = HFEngine(model, tok, HFEngineConfig(max_batch_rows=1))
    try:
        with server_thread(create_app(engine, "tiny", tok)) as srv:
            client = _client(srv)
            with pytest.raises(openai.BadRequestError, match="outside the model's vocabulary"):
                client.completions.create(
                    model="tiny", prompt=[encode("ab"), [10**6]], max_tokens=1000, extra_body={"ignore_eos": True}
                )
            steps = engine.decode_stats.steps
            short = client.completions.create(model="tiny", prompt="xy", max_tokens=3, extra_body={"ignore_eos": True})
    finally:
        engine.close()
    assert short.choices[0].finish_reason == "length" and short.usage.completion_tokens == 3
    assert engine.decode_stats.steps - steps < 500  # the abandoned prompt alone would take 999 steps


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/completions", '{"model": "tiny", "prompt": "a\\ud800b"}', "prompt"),
        ("/completions", '{"model": "tiny", "prompt": ["ok", "x\\udc00"]}', "prompt[1]"),
        ("/completions", '{"model": "tiny", "prompt": "ab", "stop": ["\\ud83d"]}', "stop[0]"),
        ("/chat/completions", '{"model": "tiny", "messages": [{"role": "user", "content": "\\ud800"}]}',
         "messages[0].content"),
        ("/completions", '{"model": "tiny", "prompt": "ab", "\\ud800": 1}', "body"),
    ],
)  # fmt: skip
def test_a_lone_surrogate_is_a_400_naming_the_field(served: Any, path: str, body: str, param: str) -> None:
    """JSON's \\ud800 escape decodes to half a UTF-16 pair, which the tokenizer cannot take: it was a 500."""
    r = httpx.post(f"{served.base_url}{path}", content=body, headers={"content-type": "application/json"}, timeout=60)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and "lone UTF-16 surrogate" in error["message"]
    # a proper pair (an emoji) is text, and is served
    ok = httpx.post(f"{served.base_url}/completions", json={"model": "tiny", "prompt": "a\U0001f600", "max_tokens": 1})
    assert ok.status_code == 200


@pytest.mark.parametrize(
    ("field", "value"),
    [("temperature", "Infinity"), ("temperature", "NaN"), ("top_p", "NaN"), ("min_p", "NaN"),
     ("presence_penalty", "NaN")],
)  # fmt: skip
def test_infinite_and_nan_sampling_values_are_refused(served: Any, field: str, value: str) -> None:
    body = f'{{"model": "tiny", "prompt": "ab", "max_tokens": 1, "{field}": {value}}}'
    r = httpx.post(f"{served.base_url}/completions", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == field and "finite number" in r.json()["error"]["message"]


def test_too_many_prompts_in_one_request_are_refused(engine: HFEngine, tok: Any, server_thread: Any) -> None:
    from rlloom.rollout.openai.server import ServerLimits, create_app

    with server_thread(create_app(engine, "tiny", tok, limits=ServerLimits(max_prompts=3))) as srv:
        over = httpx.post(f"{srv.base_url}/completions", json={"model": "tiny", "prompt": ["a"] * 4, "max_tokens": 1})
        at = httpx.post(f"{srv.base_url}/completions", json={"model": "tiny", "prompt": ["a"] * 3, "max_tokens": 1})
    assert over.status_code == 400 and over.json()["error"]["param"] == "prompt"
    assert "4 prompts exceed this server's limit of 3" in over.json()["error"]["message"]
    assert at.status_code == 200 and len(at.json()["choices"]) == 3
    assert ServerLimits().max_prompts == 1024


def test_update_weights_refuses_nan_weights_and_keeps_serving(
    served: Any, engine: HFEngine, tok: Any, tmp_path: Any, peaked_state: Any
) -> None:
    """NaN weights used to be loaded, and every later generation then failed."""
    from safetensors.torch import save_file

    before = {k: v.clone() for k, v in engine.model.state_dict().items()}
    poisoned = peaked_state(tok, seed=7)
    poisoned["model.norm.weight"][3] = float("nan")
    poisoned["model.embed_tokens.weight"][0, :2] = float("inf")
    r = httpx.post(served.base_url + "/update_weights", content=save(poisoned), timeout=60)
    assert r.status_code == 400
    message = r.json()["error"]["message"]
    assert "'model.embed_tokens.weight' holds 2 NaN or infinite value(s)" in message or (
        "'model.norm.weight' holds 1 NaN or infinite value(s)" in message
    )
    save_file(poisoned, str(tmp_path / "model.safetensors"))
    by_path = httpx.post(served.base_url + "/update_weights", json={"path": str(tmp_path)}, timeout=60)
    assert by_path.status_code == 400 and "NaN or infinite" in by_path.json()["error"]["message"]
    after = engine.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # nothing was loaded
    ok = httpx.post(served.base_url + "/completions", json={"model": "tiny", "prompt": "ab", "max_tokens": 2})
    assert ok.status_code == 200


def test_update_weights_bodies_over_the_limit_get_413(
    engine: HFEngine, tok: Any, server_thread: Any, peaked_state: Any
) -> None:
    from rlloom.rollout.openai.server import ServerLimits, create_app, update_byte_limit

    state = peaked_state(tok, seed=5)
    payload = save(state)
    fp32_bytes = sum(t.numel() * 4 for t in engine.model.state_dict().values())
    assert update_byte_limit(engine, ServerLimits()) == fp32_bytes + (64 << 20)  # room for the model in fp32
    limits = ServerLimits(max_update_bytes=len(payload) - 1)
    with server_thread(create_app(engine, "tiny", tok, limits=limits)) as srv:
        declared = httpx.post(srv.base_url + "/update_weights", content=payload, timeout=60)

        def chunks() -> Any:  # chunked transfer: no declared length, the server counts what arrives
            for i in range(0, len(payload), 4096):
                yield payload[i : i + 4096]

        streamed = httpx.post(srv.base_url + "/update_weights", content=chunks(), timeout=60)
        fits = httpx.post(srv.base_url + "/update_weights", content=save(dict(list(state.items())[:1])), timeout=60)
    for r in (declared, streamed):
        assert r.status_code == 413, r.text
        assert r.json()["error"]["code"] == "payload_too_large" and f"limit of {len(payload) - 1}" in r.text
    assert fits.status_code == 200
