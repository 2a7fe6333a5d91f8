"""Agent rollout throughput: `AgentLoop` against a synchronous Search-R1-style batch loop, same engine and model.

256 SearchEnv conversations (HotpotQA questions from /work/shared/data, BM25 over its 4,858-passage corpus with an
added 50 ms per retrieval call, the tiny Qwen2 char model behind `HFEngine`). The tiny model is first warmed up
for a few seconds of supervised steps on scripted search-then-answer conversations, so that it actually writes
`<search>`/`<answer>` turns (a random model never does, and nothing would be retrieved).

Three ways to run the same 256 conversations (same prompts, sampling, limits, engine):
- `agent_loop`: `AgentLoop`, each conversation its own asyncio task; turns stop at `</search>`/`</answer>`;
  retrieval calls of different conversations overlap with each other and with generation.
- `search_r1`: Search-R1's `LLMGenerationManager` logic: every turn generates for the whole active batch with
  no stop strings (up to `max_tokens_per_turn`, as its vLLM call does), cuts the text after the first
  `</search>` (else `</answer>`) and re-tokenises it, then one batched retrieval call, then the next turn.
- `sync_batch_stop`: the same synchronous batch loop but with stop strings in the engine (isolates the
  scheduling effect from the wasted tokens).

Prints median trajectories/s over `--repeats` runs (methods alternate within a repeat) and ratios vs baselines.

    python bench/agent.py                  # 256 conversations, 3 repeats
    python bench/agent.py --n 64 --repeats 1 --warmup-steps 60   # quick look
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from rlloom.agent import AgentLoop, AgentLoopConfig, AgentRubric, SearchEnv, SearchEnvConfig
from rlloom.agent.envs.search import ThreadedRetriever
from rlloom.agent.parsers import first_action
from rlloom.core_rl.generation import Completion, GenerationRequest, SamplingParams
from rlloom.core_rl.tiny import char_tokenizer, tiny_qwen2
from rlloom.rollout.hf_engine import HFEngine, HFEngineConfig

DATA = Path("/work/shared/data/hotpotqa/beir_style_from_ircot500")
TEMPLATE = "Search with <search> query </search>, answer with <answer> answer </answer>. Question: {question}\n"


# ----------------------------------------------------------------------------------------------- retrieval
def load_corpus() -> tuple[list[dict[str, str]], list[dict[str, Any]]]:
    corpus = [json.loads(line) for line in (DATA / "corpus.jsonl").open()]
    queries = [json.loads(line) for line in (DATA / "queries.jsonl").open()]
    # the char tokenizer has ASCII only; other characters would decode to <unk>
    queries = [q for q in queries if q["text"].isascii() and q["metadata"]["answers"][0].isascii()]
    return corpus, queries


def bm25_retriever(cache_dir: str) -> Any:
    """rlloom-retrieval's in-process BM25 index (bm25s underneath) over the HotpotQA corpus."""
    from rlloom.retrieval import build_index, load_index

    out = Path(cache_dir) / "rlloom_bench_agent_bm25"
    if not out.exists():
        build_index(DATA / "corpus.jsonl", out, "bm25")
    return load_index(out, n_threads=1)


class Delayed:
    """Adds a fixed latency to every retrieval call (a remote retrieval server's round trip)."""

    def __init__(self, inner: Any, delay_s: float) -> None:
        self.inner, self.delay_s, self.calls = inner, delay_s, 0

    def search(self, queries: Sequence[str], k: int) -> Any:
        self.calls += 1
        time.sleep(self.delay_s)
        return self.inner.search(list(queries), k)


# ----------------------------------------------------------------------------------------------- warm-up
class ScriptedPolicy:
    """Writes 1-3 searches then the gold answer; used only to make warm-up conversations through AgentLoop."""

    def __init__(self, tokenizer: Any, answers: dict[str, str], rng: random.Random) -> None:
        self.tok, self.answers, self.rng = tokenizer, answers, rng
        self.eos_token_ids = {int(tokenizer.eos_token_id)}
        self.plan: dict[str, int] = {}

    async def agenerate(self, request: GenerationRequest) -> list[Completion]:
        assert request.prompt_ids is not None
        context = self.tok.decode(request.prompt_ids, skip_special_tokens=False)
        question = context.split("Question: ", 1)[1].split("\n", 1)[0]
        n_search = self.plan.setdefault(question, self.rng.randint(1, 3))
        done = context.count("<information>")
        if done < n_search:
            words = question.rstrip("?").split()
            text = "<search> " + " ".join(words[self.rng.randint(0, max(0, len(words) - 4)) :][:6]) + " </search>"
            ids = self.tok(text, add_special_tokens=False)["input_ids"]
        else:
            text = f"<answer> {self.answers[question]} </answer>"
            ids = [*self.tok(text, add_special_tokens=False)["input_ids"], self.tok.eos_token_id]
        ids = ids[: request.sampling.max_tokens]
        return [Completion(request.request_id, list(request.prompt_ids), ids, text, "stop", [0.0] * len(ids))]

    def generate(self, requests: Sequence[GenerationRequest]) -> list[list[Completion]]:
        raise NotImplementedError("warm-up only uses agenerate")

    def update_weights(self, named_tensors: Any) -> None:
        return None


def warm_up(
    model: Any, tok: Any, retriever: Any, queries: list[dict[str, Any]], *, steps: int, loop_cfg: Any, window: int = 64
) -> float:
    """Supervised steps on the model tokens (loss_mask 1) of scripted conversations; returns the last loss."""
    rng = random.Random(0)
    answers = {
        q["text"].strip() + ("" if q["text"].strip().endswith("?") else "?"): q["metadata"]["answers"][0]
        for q in queries
    }
    policy = ScriptedPolicy(tok, answers, rng)
    env_cfg = SearchEnvConfig(template=TEMPLATE, top_k=2)
    cfg = loop_cfg.model_copy(update={"compute_reward": False})
    loop = AgentLoop(policy, tok, lambda: SearchEnv(retriever, AgentRubric(_never), env_cfg), cfg)
    rows = [{"question": q["text"], "answer": q["metadata"]["answers"][0]} for q in queries]
    trajs = loop.run(rows)
    # Training windows: each model turn with up to `window` tokens of context before it; loss on the turn only.
    examples: list[tuple[list[int], list[int]]] = []
    for t in trajs:
        seq, mask = t.prompt_ids + t.response_ids, [0] * len(t.prompt_ids) + t.loss_mask
        ends = [j + 1 for j in range(len(seq)) if mask[j] and (j + 1 == len(seq) or not mask[j + 1])]
        for end in ends:
            start = max(0, end - window)
            examples.append(
                (seq[start:end], [x if m else -100 for x, m in zip(seq[start:end], mask[start:end], strict=True)])
            )
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    loss_value = float("nan")
    for step in range(steps):
        batch = rng.sample(examples, 16)
        ids = torch.full((16, window), tok.pad_token_id)
        labels = torch.full((16, window), -100)
        for i, (seq, lab) in enumerate(batch):
            ids[i, : len(seq)] = torch.tensor(seq)
            labels[i, : len(lab)] = torch.tensor(lab)
        loss = model(input_ids=ids, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        loss_value = float(loss.detach())
        if step % 25 == 0 or step == steps - 1:
            print(f"  warm-up step {step:4d}  loss {loss_value:.3f}", flush=True)
    model.eval()
    return loss_value


def _never(response: str, ground_truth: Any, *, extra_info: Any = None) -> float:
    return 0.0


# ----------------------------------------------------------------------------------------------- baselines
def sync_batch_loop(
    engine: HFEngine, tok: Any, rows: list[dict[str, Any]], retriever: Any, cfg: AgentLoopConfig, *, use_stop: bool
) -> dict[str, float]:
    """Search-R1's generation manager: all active conversations advance one turn together."""
    env_cfg = SearchEnvConfig(template=TEMPLATE, top_k=2)
    prompt_env = SearchEnv(retriever, AgentRubric(_never), env_cfg)
    contexts: list[list[int]] = []
    for row in rows:
        prompt = prompt_env.reset(_sample(row))
        text = tok.apply_chat_template(prompt.messages, tokenize=False, add_generation_prompt=True)
        contexts.append(tok(text, add_special_tokens=False)["input_ids"])
    prompt_lens = [len(c) for c in contexts]
    active = list(range(len(rows)))
    stops = ["</search>", "</answer>"]
    marker = tok(cfg.truncation_marker, add_special_tokens=False)["input_ids"]
    turns = [0] * len(rows)
    for turn in range(cfg.max_turns):
        if not active:
            break
        requests = []
        for i in active:
            budget = min(cfg.max_tokens_per_turn, cfg.max_total_tokens - len(contexts[i]))
            params = cfg.sampling.model_copy(update={"max_tokens": budget, "stop": stops if use_stop else []})
            requests.append(GenerationRequest(prompt_ids=contexts[i], sampling=params))
        outputs = engine.generate(requests)
        queries: list[tuple[int, str]] = []
        still: list[int] = []
        for i, out in zip(active, outputs, strict=True):
            completion = out[0]
            turns[i] += 1
            if use_stop:
                ids, text = list(completion.token_ids), completion.text
            else:  # Search-R1: cut the decoded text after the first </search> (else </answer>) and re-tokenise
                text = tok.decode(completion.token_ids, skip_special_tokens=True)
                if "</search>" in text:
                    text = text.split("</search>")[0] + "</search>"
                elif "</answer>" in text:
                    text = text.split("</answer>")[0] + "</answer>"
                ids = tok(text, add_special_tokens=False)["input_ids"]
            contexts[i] = contexts[i] + ids
            action = first_action(text)
            if action is not None and action[0] == "answer":
                continue
            if len(contexts[i]) >= cfg.max_total_tokens or turn == cfg.max_turns - 1:
                continue
            if action is not None:
                queries.append((i, action[1]))
            else:
                obs_ids = _cap(tok(env_cfg.invalid_action_text, add_special_tokens=False)["input_ids"], cfg, marker)
                contexts[i] = contexts[i] + _fit(obs_ids, cfg, contexts[i])
            still.append(i)
        if queries:  # one batched retrieval call per turn, as Search-R1 POSTs all queries at once
            results = retriever.search([q for _, q in queries], env_cfg.top_k)
            for (i, _), hits in zip(queries, results, strict=True):
                body = "".join(f"Doc {r + 1}(Title: {h.title}) {h.text}\n" for r, h in enumerate(hits)).strip()
                obs = _cap(tok(body, add_special_tokens=False)["input_ids"], cfg, marker)
                wrapped = tok("\n\n<information>", add_special_tokens=False)["input_ids"] + obs
                wrapped += tok("</information>\n\n", add_special_tokens=False)["input_ids"]
                contexts[i] = contexts[i] + _fit(wrapped, cfg, contexts[i])
        active = [i for i in still if len(contexts[i]) < cfg.max_total_tokens]
    return {
        "turns": statistics.mean(turns),
        "response_tokens": statistics.mean(len(c) - p for c, p in zip(contexts, prompt_lens, strict=True)),
    }


def _cap(ids: list[int], cfg: AgentLoopConfig, marker: list[int]) -> list[int]:
    """Search-R1's max_obs_length, with the same marker the loop uses."""
    if cfg.max_obs_tokens is None or len(ids) <= cfg.max_obs_tokens:
        return ids
    return ids[: cfg.max_obs_tokens - len(marker)] + marker


def _fit(ids: list[int], cfg: AgentLoopConfig, context: list[int]) -> list[int]:
    return ids[: max(0, cfg.max_total_tokens - len(context))]


def _sample(row: dict[str, Any]) -> Any:
    from rlloom.agent import Sample

    return Sample.from_row(row)


# ----------------------------------------------------------------------------------------------- main
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=256, help="conversations per run")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--latency-ms", type=float, default=50.0, help="added latency per retrieval call")
    ap.add_argument("--warmup-steps", type=int, default=150)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--cache-dir", default="/tmp", help="where the warmed-up tiny model is kept between runs")
    ap.add_argument("--gather-ms", type=float, default=5.0, help="HFEngine's batching window for agenerate")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    _, queries = load_corpus()
    base = bm25_retriever(args.cache_dir)
    tok = char_tokenizer()
    model = tiny_qwen2(tok, max_position_embeddings=1024, seed=0)
    cfg = AgentLoopConfig(
        max_turns=4,
        max_tokens_per_turn=128,
        max_obs_tokens=96,
        max_total_tokens=1024,
        max_concurrency=args.n,
        sampling=SamplingParams(temperature=0.8),
    )
    cache = Path(args.cache_dir) / f"rlloom_bench_agent_tiny_{args.warmup_steps}.pt"
    if cache.exists():
        model.load_state_dict(torch.load(cache))
        print(f"warm-up: loaded {cache}", flush=True)
    else:
        print(f"warm-up: {args.warmup_steps} supervised steps on scripted search conversations", flush=True)
        t0 = time.perf_counter()
        warm_up(model, tok, base, queries[args.n :], steps=args.warmup_steps, loop_cfg=cfg)
        print(f"warm-up took {time.perf_counter() - t0:.1f} s", flush=True)
        torch.save(model.state_dict(), cache)

    rows = [{"question": q["text"], "answer": q["metadata"]["answers"][0]} for q in queries[: args.n]]
    engine = HFEngine(model, tok, HFEngineConfig(max_batch_rows=64, gather_s=args.gather_ms / 1000))
    delayed = Delayed(base, args.latency_ms / 1000)
    threaded = ThreadedRetriever(delayed, max_threads=args.n)
    env_cfg = SearchEnvConfig(template=TEMPLATE, top_k=2)
    loop = AgentLoop(engine, tok, lambda: SearchEnv(threaded, AgentRubric(_never), env_cfg), cfg)

    times: dict[str, list[float]] = {"agent_loop": [], "search_r1": [], "sync_batch_stop": []}
    stats: dict[str, dict[str, float]] = {}
    for rep in range(args.repeats):
        order = ["agent_loop", "search_r1", "sync_batch_stop"]
        if rep % 2:
            order.reverse()
        for name in order:
            delayed.calls = 0
            t0 = time.perf_counter()
            if name == "agent_loop":
                trajs = asyncio.run(loop.arun(rows))
                s = {
                    "turns": statistics.mean(t.metrics["turns"] for t in trajs),
                    "response_tokens": statistics.mean(len(t.response_ids) for t in trajs),
                    "searches": statistics.mean(t.metrics.get("searches", 0.0) for t in trajs),
                }
            else:
                s = sync_batch_loop(engine, tok, rows, delayed, cfg, use_stop=name == "sync_batch_stop")
            elapsed = time.perf_counter() - t0
            s["retrieval_calls"] = delayed.calls
            times[name].append(elapsed)
            stats[name] = s
            print(f"  repeat {rep} {name:16s} {elapsed:6.2f} s  {args.n / elapsed:6.1f} traj/s  {s}", flush=True)
    engine.close()
    threaded.close()

    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"\n{args.n} SearchEnv trajectories, {args.latency_ms:.0f} ms per retrieval call, median of {args.repeats}:")
    print("| method | traj/s | mean turns | mean response tokens | retrieval calls | AgentLoop speed-up |")
    print("|---|---|---|---|---|---|")
    for name in times:
        s = stats[name]
        print(
            f"| {name} | {args.n / med[name]:.1f} | {s['turns']:.2f} | {s['response_tokens']:.0f} | "
            f"{s['retrieval_calls']:.0f} | {med[name] / med['agent_loop']:.2f}x |"
        )


if __name__ == "__main__":
    main()
