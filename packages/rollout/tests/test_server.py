"""The OpenAI-compatible server answering the official `openai` client over real HTTP."""

from __future__ import annotations

import io
from typing import Any

import httpx
import openai
import pytest
import torch
from safetensors.torch import save

from rlloom.core_rl.generation import GenerationRequest, SamplingParams
from rlloom.core_rl.tiny import tiny_qwen2
from rlloom.rollout.hf_engine import HFEngine


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
