"""`InflightOpenAIEngine`: core-rl's `InflightWeightUpdate` over rlloom's own server (HFEngine behind it). A push
through the client mid-request (pause, /v1/update_weights, resume) continues the request under the new weights,
and the tokens come back labelled with the version that sampled them.

As in test_hf_inflight_update, the change touches only the final norm, so the reference is independent of the pause
machinery: the old weights' greedy text up to the pause, then a second engine with the new weights continuing it.
"""

from __future__ import annotations

import copy
import threading
from typing import Any

import torch
from test_hf_inflight_update import _greedy, _new_norm, _wait_for, sharp  # noqa: F401 (sharp is a fixture)

from rlloom.core_rl.contracts.engines import InflightWeightUpdate
from rlloom.core_rl.contracts.generation import Completion
from rlloom.rollout.hf.engine import HFEngine, HFEngineConfig
from rlloom.rollout.openai.engine import OpenAIEngine, OpenAIEngineConfig
from rlloom.rollout.openai.inflight import InflightOpenAIEngine
from rlloom.rollout.openai.server import create_app

TOKENS = 120


def test_a_push_through_the_client_mid_request_continues_it_under_the_new_weights(
    sharp: torch.nn.Module,  # noqa: F811 (the imported fixture)
    tok: Any,
    encode: Any,
    server_thread: Any,
) -> None:
    old_model, new_weights = copy.deepcopy(sharp), _new_norm(sharp)
    new_model = copy.deepcopy(sharp)
    new_model.load_state_dict(new_weights, strict=False)
    engine = HFEngine(sharp, tok, HFEngineConfig(gather_s=0.0))
    prompt = encode("the weights change")
    done: list[Completion] = []
    try:
        with server_thread(create_app(engine, "tiny", tok, default_max_tokens=16)) as srv:
            client = InflightOpenAIEngine(OpenAIEngineConfig(base_url=srv.base_url, model="tiny", max_retries=0))
            assert isinstance(client, InflightWeightUpdate) and client.keeps_kv_cache
            thread = threading.Thread(target=lambda: done.extend(client.generate([_greedy(prompt, TOKENS)])[0]))
            thread.start()
            _wait_for(lambda: engine.decode_stats.steps >= 5)
            client.pause_generation()
            client.update_weights(new_weights)
            client.resume_generation(5)
            thread.join(120)
    finally:
        engine.close()
    [completion] = done
    versions = completion.policy_versions or []
    k = versions.index(5) if 5 in versions else -1
    assert 5 <= k < TOKENS, f"the pause should fall mid-generation (first new-version token at {k})"
    assert versions == [0] * k + [5] * (TOKENS - k)
    old_engine, new_engine = HFEngine(old_model, tok), HFEngine(new_model, tok)
    try:
        [[old_all]] = old_engine.generate([_greedy(prompt, TOKENS)])
        [[continued]] = new_engine.generate([_greedy(prompt + completion.token_ids[:k], TOKENS - k)])
    finally:
        old_engine.close()
        new_engine.close()
    assert completion.token_ids[:k] == old_all.token_ids[:k]
    assert completion.token_ids[k:] == continued.token_ids
    assert completion.token_ids[k:] != old_all.token_ids[k:]


def test_the_client_tells_a_server_whose_engine_cannot_update_in_flight(
    engine: HFEngine, tok: Any, server_thread: Any
) -> None:
    """Behind the server, an engine with generation only: the client reports no KV cache kept (so async refuses
    keep_kv) and a pause fails naming the endpoint; a plain OpenAIEngine is not InflightWeightUpdate at all."""
    import pytest

    from rlloom.rollout.openai.engine import OpenAIEngineError

    class Plain:
        context_window = engine.context_window

        async def agenerate(self, request: Any) -> list[Completion]:
            return await engine.agenerate(request)

    with server_thread(create_app(Plain(), "tiny", tok)) as srv:  # type: ignore[arg-type]
        config = OpenAIEngineConfig(base_url=srv.base_url, model="tiny", max_retries=0)
        client = InflightOpenAIEngine(config)
        assert client.keeps_kv_cache is False
        with pytest.raises(OpenAIEngineError, match="pause_generation.*refused \\(400\\)"):
            client.pause_generation()
    assert not isinstance(OpenAIEngine(config), InflightWeightUpdate)
