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


def test_an_async_run_through_the_client_pushes_in_flight_and_ends_on_the_trained_weights(
    tok: Any, server_thread: Any, tmp_path: Any
) -> None:
    """`Trainer(engine=InflightOpenAIEngine)` at trainer.mode=async: every push pauses the served HFEngine,
    loads over /v1/update_weights and resumes with the step's version; the batches stay within max_staleness by
    the server's own per-token labels, and the served model ends on the actor's weights."""
    from rlloom.core_rl.config.loading import load_config
    from rlloom.core_rl.contracts.protocols import RewardOutput
    from rlloom.core_rl.tiny import tiny_qwen2
    from rlloom.core_rl.trainer import Trainer

    tiny_qwen2(tok, seed=0).save_pretrained(tmp_path / "model")
    tok.save_pretrained(tmp_path / "model")
    served_model = tiny_qwen2(tok, seed=0).eval()
    engine = HFEngine(served_model, tok, HFEngineConfig(gather_s=0.0))
    overrides = [
        f"model.path={tmp_path / 'model'}", "model.dtype=float32", "data.train_batch_size=2", "rollout.n=2",
        "rollout.max_tokens=16", "actor.mini_batch_size=2", "actor.warmup_steps=0", "actor.lr=0.01",
        "trainer.total_steps=2", "trainer.save_every=0", "trainer.device=cpu", "trainer.trackers=[jsonl]",
        f"trainer.output_dir={tmp_path / 'run'}", "trainer.mode=async", "trainer.streaming.max_staleness=1",
    ]  # fmt: skip
    rows = [{"prompt": [{"role": "user", "content": f"{a}+{b}="}], "data_source": "toy"} for a, b in [(1, 2), (3, 4)]]

    def reward(trajectories: Any) -> list[RewardOutput]:
        return [RewardOutput(score=sum(c.isdigit() for c in t.response_text) / 8) for t in trajectories]

    try:
        with server_thread(create_app(engine, "tiny", tok)) as srv:
            client = InflightOpenAIEngine(OpenAIEngineConfig(base_url=srv.base_url, model="tiny", max_retries=0))
            trainer = Trainer(load_config(None, overrides), engine=client, reward_fn=reward, train_data=rows * 2)
            trainer.fit()
    finally:
        engine.close()
    import json

    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [line for line in lines if "async/staleness_max" in line]
    assert len(steps) == 2 and max(line["async/staleness_max"] for line in steps) <= 1.0
    actor = dict(trainer.parts.actor.named_weights())
    served = dict(served_model.named_parameters())
    compared = [torch.equal(served[name], tensor) for name, tensor in actor.items() if name in served]
    assert len(compared) >= 20 and all(compared)
