"""Every engine of this package implements exactly the capabilities (core-rl's `contracts.engines` Protocols) it
has, and the vLLM engines share one weight-sync lifecycle (`vllm.weights.WeightSync`).

The expectations are written by hand from what each engine does: HF decodes in this process with its own tokenizer
and batcher thread; an OpenAI client knows its server's context window and EOS ids and holds a connection pool per
event loop; vLLM sleeps, syncs in sessions and counts them; a pool reports its replicas' window and EOS ids and
closes them. The vLLM engines cannot start here (no vLLM in this environment): they are checked on the class, by
the members it defines or declares, a check validated on the engines that do start.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
import torch
from typing_extensions import get_protocol_members

from rlloom.core_rl.contracts.engines import (
    CAPABILITIES,
    AsyncClosable,
    Closable,
    HasContextWindow,
    HasEosTokens,
    HasTokenizer,
    InflightWeightUpdate,
    RolloutEngine,
    SleepMode,
    WeightSyncCount,
    WeightSyncLifecycle,
    describe_engine,
    engine_capabilities,
)
from rlloom.core_rl.tiny import tiny_qwen2
from rlloom.rollout.hf.engine import HFEngine
from rlloom.rollout.openai.engine import OpenAIEngine, OpenAIEngineConfig
from rlloom.rollout.pool import RolloutPool
from rlloom.rollout.vllm.async_engine import VLLMAsyncEngine
from rlloom.rollout.vllm.engine import VLLMEngine
from rlloom.rollout.vllm.server_engine import VLLMServerConfig, VLLMServerEngine
from rlloom.rollout.vllm.weights import WeightSync, WeightSyncError, WeightSyncSession

VLLM_CAPABILITIES = {SleepMode, WeightSyncLifecycle, WeightSyncCount, HasContextWindow, HasTokenizer, Closable}
EXPECTED: dict[str, set[type]] = {
    "HFEngine": {HasContextWindow, HasEosTokens, HasTokenizer, Closable, InflightWeightUpdate},
    "OpenAIEngine": {HasContextWindow, HasEosTokens, AsyncClosable},
    "VLLMServerEngine": {
        HasContextWindow,
        HasEosTokens,
        AsyncClosable,
        WeightSyncLifecycle,
        WeightSyncCount,
        InflightWeightUpdate,  # vLLM's dev-mode /pause and /resume (issue 42)
    },
    "RolloutPool": {HasContextWindow, HasEosTokens, Closable, InflightWeightUpdate},  # its HF replicas have it
    "VLLMEngine": VLLM_CAPABILITIES,
    "VLLMAsyncEngine": VLLM_CAPABILITIES | {InflightWeightUpdate},
}
OPTIONAL = sorted(set(CAPABILITIES.values()), key=lambda p: p.__name__)


def class_implements(cls: type, protocol: type) -> bool:
    """Whether every instance of `cls` has `protocol`'s members: methods and properties the class defines, or
    attributes it declares (annotated on the class, set in `__init__`)."""
    declared = set(dir(cls)) | {name for klass in cls.__mro__ for name in vars(klass).get("__annotations__", {})}
    return get_protocol_members(protocol) <= declared


@pytest.fixture(scope="module")
def engines(tok: Any) -> Any:
    """One started instance of each engine that starts without vLLM or a server (none of them connects here)."""
    hf = HFEngine(tiny_qwen2(tok, seed=0), tok)
    client = OpenAIEngine(OpenAIEngineConfig(base_url="http://127.0.0.1:9/v1", model="tiny", context_window=64))
    server = VLLMServerEngine(VLLMServerConfig(base_url="http://127.0.0.1:9/v1", model="tiny", context_window=64))
    pool = RolloutPool(lambda: HFEngine(tiny_qwen2(tok, seed=0), tok), replicas=2, backend="thread")
    made = {"HFEngine": hf, "OpenAIEngine": client, "VLLMServerEngine": server, "RolloutPool": pool}
    yield made
    hf.close()
    pool.close()


def test_every_engine_is_a_rollout_engine(engines: dict[str, Any]) -> None:
    assert all(isinstance(engine, RolloutEngine) for engine in engines.values())
    assert class_implements(VLLMEngine, RolloutEngine) and class_implements(VLLMAsyncEngine, RolloutEngine)


@pytest.mark.parametrize("protocol", OPTIONAL, ids=lambda p: p.__name__)
def test_each_engine_has_a_capability_exactly_when_it_implements_it(protocol: type, engines: dict[str, Any]) -> None:
    for name, engine in engines.items():
        assert isinstance(engine, protocol) == (protocol in EXPECTED[name]), name
        # the class-level check the vLLM engines get agrees with isinstance where both can run
        assert class_implements(type(engine), protocol) == (protocol in EXPECTED[name]), name
    for cls in (VLLMEngine, VLLMAsyncEngine):
        assert class_implements(cls, protocol) == (protocol in EXPECTED[cls.__name__]), cls.__name__


def test_a_replica_reports_its_capabilities_and_what_it_knows_of_its_model(engines: dict[str, Any]) -> None:
    hf = engines["HFEngine"]
    assert engine_capabilities(hf) == {
        "context_window",
        "eos_tokens",
        "tokenizer",
        "closable",
        "inflight_weight_update",
    }
    described = describe_engine(hf)
    assert described["context_window"] == hf.model.config.max_position_embeddings
    assert described["eos_token_ids"] == frozenset(hf.eos_token_ids) and described["eos_token_ids"]
    # an engine that knows neither reports None for both
    assert describe_engine(object()) == {"capabilities": [], "context_window": None, "eos_token_ids": None}
    # the pool passes its replicas' values on, and is itself what it reports
    pool = engines["RolloutPool"]
    assert (pool.context_window, pool.eos_token_ids) == (described["context_window"], described["eos_token_ids"])


class _RecordingRpc:
    """Stands in for vLLM's `collective_rpc` (as test_vllm_engine's does): records each call, may fail one."""

    def __init__(self, fail: str | None = None) -> None:
        self.calls: list[str] = []
        self.fail = fail

    def __call__(self, method: str, args: tuple[Any, ...] = ()) -> list[Any]:
        self.calls.append(method)
        if method == self.fail:
            raise RuntimeError("worker failed")
        return [None]


def test_the_shared_weight_sync_lifecycle_buckets_labels_finishes_and_counts() -> None:
    rpc, finished = _RecordingRpc(), []
    sync = WeightSync(WeightSyncSession(rpc, timeout_s=5.0), bucket_bytes=64, on_finish=lambda: finished.append(1))
    sync.load({})  # nothing to push opens nothing
    assert rpc.calls == [] and not sync.pending
    sync.begin(3)
    # four fp32 tensors of 16 elements (64 bytes each) in buckets of 64 bytes: one call per tensor
    sync.load({f"w{i}": torch.zeros(16) for i in range(4)})
    assert rpc.calls == ["rlloom_start_weight_update"] + ["rlloom_load_weights"] * 4 and sync.pending
    sync.ready()  # before a generation: closes the session, then the engine's caches go
    assert rpc.calls[-1] == "rlloom_finish_weight_update" and finished == [1] and sync.completed == 1
    sync.finish()  # no session open: nothing sent, no cache dropped twice
    assert len(rpc.calls) == 6 and finished == [1] and not sync.pending


def test_a_failed_sync_names_its_step_and_keeps_generation_refused() -> None:
    sync = WeightSync(WeightSyncSession(_RecordingRpc(fail="rlloom_load_weights"), timeout_s=5.0), bucket_bytes=64)
    sync.begin(7)
    with pytest.raises(WeightSyncError, match=r"training step 7\), bucket 1"):
        sync.load({"w": torch.zeros(4)})
    assert sync.pending and sync.completed == 0
    with pytest.raises(WeightSyncError, match="refusing to generate"):
        sync.ready()


def test_the_lifecycle_holds_the_engines_lock() -> None:
    """Given the engine's lock (VLLMEngine generates under it), a sync waits for a generation holding it."""
    lock, entered = threading.RLock(), threading.Event()
    sync = WeightSync(WeightSyncSession(_RecordingRpc(), timeout_s=5.0), bucket_bytes=64, lock=lock)
    with lock:  # a generation in progress
        worker = threading.Thread(target=lambda: (sync.begin(1), entered.set()))
        worker.start()
        assert not entered.wait(timeout=0.2)
    assert entered.wait(timeout=10)
    worker.join()
    assert sync.session.step == 1
