"""Agent rollout throughput: `AgentLoop` against a synchronous Search-R1-style batch loop, same engine and model.

256 SearchEnv conversations (HotpotQA questions from /work/shared/data, BM25 over its 4,858-passage corpus with an
added 50 ms per retrieval call, the tiny Qwen2 char model behind `HFEngine` with continuous batching and prefix
caching, emptied before each method). The tiny model is first warmed up with 2,000 supervised steps (about
6 minutes on one core; cached under --cache-dir) on whole scripted conversations run through `AgentLoop` itself:
`<search> 2-5 words of the question </search>`, the real BM25 `<information>`, then another search or
`<answer> gold </answer>` EOS, 1-3 searches each. The loss covers everything after the prompt, observations
included, as pretraining does for a real LLM: so, like Search-R1's Qwen2.5 models, the model writes on past
`</search>` (a made-up `<information>` block...) when nothing stops it (`--warmup-loss model` trains on its own
turns only; that model ends a turn with EOS right after `</search>`, which real LLMs do not). The warm-up is
deterministic (each scripted conversation draws from its own seeded generator, whatever order the retrieval threads
finish in; one torch thread), so the same code on the same kind of CPU builds the same model: the run prints its
weights' digest, and readings with different digests ran different models. Every method prints
its mean searches and answered fraction; the run stops if a method made no searches (then nothing was
retrieved and the comparison would be void). Per-turn budget: Search-R1's 500 tokens (`--max-tokens-per-turn`).

Three ways to run the same 256 conversations (same prompts, sampling, limits, engine):
- `agent_loop`: `AgentLoop`, each conversation its own asyncio task; turns stop at `</search>`/`</answer>`;
  retrieval calls of different conversations overlap with each other and with generation.
- `search_r1`: Search-R1's `LLMGenerationManager` logic: every turn generates for the whole active batch with
  no stop strings (up to `max_tokens_per_turn`, as its vLLM call does), cuts the text after the first
  `</search>` (else `</answer>`) and re-tokenises it, then one batched retrieval call, then the next turn.
- `sync_batch_stop`: the same synchronous batch loop but with stop strings in the engine (isolates the
  scheduling effect from the wasted tokens).

Sampling is seeded per conversation and turn (`--seed`; repeat r uses its own seed) the same way in every
method, so within a repeat the three methods run the same conversations (up to float noise between batch
layouts) and differ only in how they schedule them; search_r1 additionally samples past the tool tag.
Prints median trajectories/s over `--repeats` runs (methods alternate within a repeat), the tokens each method
had the engine sample, and AgentLoop's speed-up. One torch thread by default: the tiny model only loses from
intra-op threads on a shared 2-core machine. Every method uses the same engine (`--max-batch-rows`, default 64).

    python bench/agent.py                  # 256 conversations, 3 repeats
    python bench/agent.py --n 64 --repeats 1   # quick look
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import random
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from rlloom.agent import AgentLoop, AgentLoopConfig, AgentRubric, SearchEnv, SearchEnvConfig
from rlloom.agent.envs.search import ThreadedRetriever
from rlloom.agent.parsers import first_action
from rlloom.core_rl.contracts.generation import Completion, GenerationRequest, SamplingParams
from rlloom.core_rl.contracts.prompts import render_prompt
from rlloom.core_rl.tiny import char_tokenizer, tiny_qwen2
from rlloom.rollout.hf.engine import HFEngine, HFEngineConfig

DATA = Path("/work/shared/data/hotpotqa/beir_style_from_ircot500")
DEFAULT_N = 256  # conversations per run; the warm-up learns from the questions after the first max(256, --n)
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

    def __init__(self, tokenizer: Any, answers: dict[str, str], seed: int) -> None:
        self.tok, self.answers, self.seed = tokenizer, answers, seed
        self.eos_token_ids = {int(tokenizer.eos_token_id)}
        self.plan: dict[int, int] = {}  # searches planned per conversation
        # One generator per conversation: conversations interleave in whatever order their retrieval threads
        # finish, so a shared generator would hand out different draws (and build a different model) every run.
        self.rngs: dict[int, random.Random] = {}

    async def agenerate(self, request: GenerationRequest) -> list[Completion]:
        assert request.prompt_ids is not None
        context = self.tok.decode(request.prompt_ids, skip_special_tokens=False)
        question = context.split("Question: ", 1)[1].split("\n", 1)[0]
        done = context.count("<information>")
        # AgentLoop seeds turn t of conversation c with base + 1_000_003 * c + t; here turn t == searches done
        conversation = (request.sampling.seed or 0) - done
        rng = self.rngs.setdefault(conversation, random.Random(self.seed * 1_000_003 + conversation))
        n_search = self.plan.setdefault(conversation, rng.randint(1, 3))
        if done < n_search:
            words = question.rstrip("?").split()
            span = rng.randint(2, 5)
            start = rng.randint(0, max(0, len(words) - span))
            text = "<search> " + " ".join(words[start : start + span]) + " </search>"
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
    model: Any,
    tok: Any,
    retriever: Any,
    queries: list[dict[str, Any]],
    *,
    steps: int,
    loop_cfg: Any,
    batch_size: int = 8,
    copies: int = 6,
    loss_on: str = "conversation",
    seed: int = 0,
) -> float:
    """Supervised steps on scripted conversations; returns the last loss.

    The scripted conversations go through `AgentLoop` itself, so the model learns exactly the token layout it
    will see: prompt -> `<search> 2-5 words of the question </search>`, `<information>...</information>`, then
    another search or `<answer> gold </answer>` + EOS, with 1-3 searches per conversation.

    `loss_on="conversation"` (default) trains language-model style on everything after the prompt, observations
    included, as pretraining does for a real LLM: the model then knows that text goes on after `</search>` (an
    `<information>` block), so an engine with no stop string lets it write on, as Search-R1's Qwen2.5 runs do
    (`../shared/design/notes/search_r1_retrieval.md`). `loss_on="model"` puts loss on the model's own tokens
    only (SFT style); that model ends its turn with EOS right after `</search>`, which real LLMs do not.
    """
    rng = random.Random(seed)
    answers = {
        q["text"].strip() + ("" if q["text"].strip().endswith("?") else "?"): q["metadata"]["answers"][0]
        for q in queries
    }
    policy = ScriptedPolicy(tok, answers, seed=seed)
    env_cfg = SearchEnvConfig(template=TEMPLATE, top_k=2)
    sampling = loop_cfg.sampling.model_copy(update={"seed": 0})  # the seeds tell conversations apart
    cfg = loop_cfg.model_copy(update={"compute_reward": False, "sampling": sampling})
    loop = AgentLoop(policy, tok, lambda: SearchEnv(retriever, AgentRubric(_never), env_cfg), cfg)
    rows = [{"question": q["text"], "answer": q["metadata"]["answers"][0]} for q in queries]
    trajs = loop.run(rows, n=copies)  # each question several times, with other queries and search counts
    # Whole conversations (the model must see its turns at the positions and context lengths it will meet when
    # sampling; short windows taught it a format it then forgot in long contexts).
    examples: list[tuple[list[int], list[int]]] = []
    for t in trajs:
        trained = t.loss_mask if loss_on == "model" else [1] * len(t.response_ids)
        seq, mask = t.prompt_ids + t.response_ids, [0] * len(t.prompt_ids) + trained
        examples.append((seq, [x if m else -100 for x, m in zip(seq, mask, strict=True)]))
    searches = statistics.mean(t.metrics.get("searches", 0.0) for t in trajs)
    print(f"  {len(trajs)} scripted conversations ({searches:.2f} searches each)", flush=True)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps, eta_min=3e-4)
    model.train()
    loss_value = float("nan")
    bar = tqdm(range(steps), desc="warm-up", mininterval=5.0)
    for _ in bar:
        batch = rng.sample(examples, batch_size)
        width = max(len(seq) for seq, _ in batch)
        ids = torch.full((batch_size, width), tok.pad_token_id)
        labels = torch.full((batch_size, width), -100)
        for i, (seq, lab) in enumerate(batch):
            ids[i, : len(seq)] = torch.tensor(seq)
            labels[i, : len(lab)] = torch.tensor(lab)
        loss = model(input_ids=ids, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        loss_value = float(loss.detach())
        bar.set_postfix(loss=f"{loss_value:.3f}", refresh=False)
    bar.close()
    print(f"  warm-up final loss {loss_value:.3f}", flush=True)
    model.eval()
    return loss_value


def weights_digest(model: torch.nn.Module) -> str:
    """A short hash of the weights, so two readings can tell whether they ran the same warmed-up model."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]


def turns_at_limit(trajs: Sequence[Any], budget: int) -> float:
    """The share of model turns that ran to a length limit (the per-turn budget, or the context's end) without
    closing a tag: the tiny model's format slips. Such a turn costs AgentLoop as many tokens as Search-R1's loop, so
    this share, more than anything in the loop, sets the reading."""
    turns = at_limit = 0
    for t in trajs:
        runs = [len(run) for run in "".join("x" if m else " " for m in t.loss_mask).split()]  # the model's turns
        turns += len(runs)
        at_limit += sum(n >= budget for n in runs[:-1])
        at_limit += bool(runs) and (runs[-1] >= budget or t.finish_reason == "length")
    return at_limit / max(turns, 1)


def _never(response: str, ground_truth: Any, *, extra_info: Any = None) -> float:
    return 0.0


# ----------------------------------------------------------------------------------------------- baselines
def sync_batch_loop(
    engine: HFEngine, tok: Any, rows: list[dict[str, Any]], retriever: Any, cfg: AgentLoopConfig, *, use_stop: bool
) -> dict[str, float]:
    """Search-R1's generation manager: all active conversations advance one turn together.

    With `cfg.sampling.seed`, turn t of conversation i is seeded as `AgentLoop` seeds it, so every method
    samples the same conversations (up to float noise between batch layouts).
    """
    env_cfg = SearchEnvConfig(template=TEMPLATE, top_k=2)
    prompt_env = SearchEnv(retriever, AgentRubric(_never), env_cfg)
    contexts: list[list[int]] = []
    for row in rows:
        prompt = prompt_env.reset(_sample(row))
        contexts.append(render_prompt(tok, GenerationRequest(messages=prompt.messages)))
    prompt_lens = [len(c) for c in contexts]
    active = list(range(len(rows)))
    stops = ["</search>", "</answer>"]
    marker = tok(cfg.truncation_marker, add_special_tokens=False)["input_ids"]
    turns = [0] * len(rows)
    searches = [0] * len(rows)
    answered = [False] * len(rows)
    generated = [0] * len(rows)  # tokens the engine sampled (before Search-R1's cut)
    for turn in range(cfg.max_turns):
        if not active:
            break
        requests = []
        for i in active:
            budget = min(cfg.max_tokens_per_turn, cfg.max_total_tokens - len(contexts[i]))
            update: dict[str, Any] = {"max_tokens": budget, "stop": stops if use_stop else []}
            if cfg.sampling.seed is not None:
                update["seed"] = cfg.sampling.seed + 1_000_003 * i + turn
            params = cfg.sampling.model_copy(update=update)
            requests.append(GenerationRequest(prompt_ids=contexts[i], sampling=params))
        outputs = engine.generate(requests)
        queries: list[tuple[int, str]] = []
        still: list[int] = []
        for i, out in zip(active, outputs, strict=True):
            completion = out[0]
            turns[i] += 1
            generated[i] += len(completion.token_ids)
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
                answered[i] = True
                continue
            if len(contexts[i]) >= cfg.max_total_tokens or turn == cfg.max_turns - 1:
                continue
            if contexts[i][-1] == tok.eos_token_id:  # an observation follows in the same message: no EOS there
                contexts[i] = contexts[i][:-1]  # (Search-R1's re-tokenised text never has one; AgentLoop drops it)
            if action is not None:
                queries.append((i, action[1]))
                searches[i] += 1
            else:
                obs_ids = _cap(tok(env_cfg.invalid_action_text, add_special_tokens=False)["input_ids"], cfg, marker)
                contexts[i] = contexts[i] + _fit(obs_ids, cfg, contexts[i])
            still.append(i)
        if queries:  # one batched retrieval call per turn, as Search-R1 POSTs all queries at once
            results = retriever.search([q for _, q in queries], env_cfg.top_k)
            for (i, _), hits in zip(queries, results, strict=True):
                body = prompt_env.format_passages(hits).strip()  # the same passage text SearchEnv shows
                obs = _cap(tok(body, add_special_tokens=False)["input_ids"], cfg, marker)
                wrapped = tok("\n\n<information>", add_special_tokens=False)["input_ids"] + obs
                wrapped += tok("</information>\n\n", add_special_tokens=False)["input_ids"]
                contexts[i] = contexts[i] + _fit(wrapped, cfg, contexts[i])
        active = [i for i in still if len(contexts[i]) < cfg.max_total_tokens]
    return {
        "turns": statistics.mean(turns),
        "searches": statistics.mean(searches),
        "answered": statistics.mean(answered),
        "generated_tokens": statistics.mean(generated),
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


# ----------------------------------------------------------------------------------------------- the model
def add_model_shape_args(ap: argparse.ArgumentParser) -> None:
    """The tiny model's shape (default: `tiny_qwen2`'s, head size 16); vLLM's CPU attention needs head size 64."""
    ap.add_argument("--hidden-size", type=int, default=64, help="tiny Qwen2 hidden size")
    ap.add_argument("--num-heads", type=int, default=4, help="attention heads (head size = hidden / heads)")
    ap.add_argument("--num-kv-heads", type=int, default=2, help="key/value heads")


def warmed_up_model(args: argparse.Namespace, tok: Any, base: Any, queries: list[dict[str, Any]], cfg: Any) -> Any:
    """The warmed-up tiny model of these arguments, from --cache-dir or warmed up now (deterministic) and cached."""
    shape = {"hidden_size": args.hidden_size, "num_heads": args.num_heads, "num_kv_heads": args.num_kv_heads}
    model = tiny_qwen2(tok, max_position_embeddings=1024, seed=args.warmup_seed, **shape)
    # The warm-up never sees a benchmarked question, and its questions do not depend on --n (up to 256), so a
    # quick `--n 64` look runs the same model as the full run; the cache name records what the model learnt from.
    first_warmup_question = max(DEFAULT_N, args.n)
    name = f"rlloom_bench_agent_tiny_v4_{args.warmup_loss}_{args.warmup_steps}_from{first_warmup_question}"
    if (args.hidden_size, args.num_heads, args.num_kv_heads) != (64, 4, 2):  # the default shape keeps its old name
        name += f"_h{args.hidden_size}x{args.num_heads}kv{args.num_kv_heads}"
    name += f"_seed{args.warmup_seed}.pt" if args.warmup_seed else ".pt"
    cache = Path(args.cache_dir) / name
    if cache.exists():
        model.load_state_dict(torch.load(cache))
        print(f"warm-up: loaded {cache}", flush=True)
    else:
        print(f"warm-up: {args.warmup_steps} supervised steps on scripted search conversations", flush=True)
        t0 = time.perf_counter()
        warm_up(
            model,
            tok,
            base,
            queries[first_warmup_question:],
            steps=args.warmup_steps,
            loop_cfg=cfg,
            loss_on=args.warmup_loss,
            seed=args.warmup_seed,
        )
        print(f"warm-up took {time.perf_counter() - t0:.1f} s", flush=True)
        torch.save(model.state_dict(), cache)
    print(f"warm-up model: sha256 {weights_digest(model)} (same code, same CPU kind: same digest)", flush=True)
    return model


# ----------------------------------------------------------------------------------------------- main
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=DEFAULT_N, help="conversations per run")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--latency-ms", type=float, default=50.0, help="added latency per retrieval call")
    ap.add_argument("--warmup-steps", type=int, default=2000)
    ap.add_argument("--temperature", type=float, default=0.8, help="sampling temperature of every method")
    ap.add_argument(
        "--seed",
        type=int,
        default=0,
        help="repeat r samples with seed SEED + r * 1_000_000_007 in every method, so the methods of one repeat "
        "run the same conversations; -1 samples unseeded",
    )
    ap.add_argument(
        "--max-tokens-per-turn",
        type=int,
        default=500,
        help="sampling budget per model turn, every method (Search-R1's max_response_length; a stop string ends "
        "a turn sooner)",
    )
    ap.add_argument("--max-batch-rows", type=int, default=64, help="HFEngine's row budget (every method)")
    ap.add_argument(
        "--threads", type=int, default=1, help="torch intra-op threads (1: the tiny model gains nothing from more)"
    )
    ap.add_argument(
        "--warmup-loss",
        choices=["conversation", "model"],
        default="conversation",
        help="conversation: LM loss on all tokens after the prompt, as pretraining (the model writes on past "
        "</search> when nothing stops it, like a real LLM); model: loss on the model's own turns only",
    )
    ap.add_argument(
        "--warmup-seed",
        type=int,
        default=0,
        help="seeds the tiny model's initial weights, the scripted conversations and the warm-up batches; another "
        "seed builds another model (how much the reading depends on the model)",
    )
    ap.add_argument("--cache-dir", default="/tmp", help="where the warmed-up tiny model is kept between runs")
    add_model_shape_args(ap)
    ap.add_argument(
        "--prefix-cache-tokens",
        type=int,
        default=262_144,
        help="HFEngine's prefix cache (every method; emptied before each run); 0 turns it off",
    )
    ap.add_argument("--gather-ms", type=float, default=5.0, help="HFEngine's batching window for agenerate")
    ap.add_argument(
        "--device",
        default="cpu",
        help="where the engine runs (cuda: the warm-up still runs on CPU, then the model moves; a GPU step costs "
        "about the same for 5 rows as for 64, so there the per-turn barrier is what the baseline pays for)",
    )
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.warmup_seed)

    _, queries = load_corpus()
    base = bm25_retriever(args.cache_dir)
    tok = char_tokenizer()
    cfg = AgentLoopConfig(
        max_turns=4,
        max_tokens_per_turn=args.max_tokens_per_turn,
        max_obs_tokens=96,
        max_total_tokens=1024,
        max_concurrency=args.n,
        sampling=SamplingParams(temperature=args.temperature),
    )
    model = warmed_up_model(args, tok, base, queries, cfg)

    rows = [{"question": q["text"], "answer": q["metadata"]["answers"][0]} for q in queries[: args.n]]
    torch.nn.Module.to(model, torch.device(args.device))
    engine = HFEngine(
        model,
        tok,
        HFEngineConfig(
            max_batch_rows=args.max_batch_rows,
            gather_s=args.gather_ms / 1000,
            prefix_cache_tokens=args.prefix_cache_tokens,
        ),
    )
    delayed = Delayed(base, args.latency_ms / 1000)
    threaded = ThreadedRetriever(delayed, max_threads=args.n)
    env_cfg = SearchEnvConfig(template=TEMPLATE, top_k=2)

    times: dict[str, list[float]] = {"agent_loop": [], "search_r1": [], "sync_batch_stop": []}
    load_before = os.getloadavg()
    stats: dict[str, dict[str, float]] = {}
    for rep in range(args.repeats):
        order = ["agent_loop", "search_r1", "sync_batch_stop"]
        if rep % 2:
            order.reverse()
        if args.seed >= 0:
            seeded = cfg.sampling.model_copy(update={"seed": args.seed + rep * 1_000_000_007})
            cfg = cfg.model_copy(update={"sampling": seeded})
        loop = AgentLoop(engine, tok, lambda: SearchEnv(threaded, AgentRubric(_never), env_cfg), cfg)
        for name in order:
            delayed.calls = 0
            if engine.prefix_cache is not None:  # no method may reuse another's keys/values
                engine.prefix_cache.clear()
            prefilled, reused = engine.decode_stats.prefill_tokens, engine.decode_stats.reused_tokens
            t0 = time.perf_counter()
            if name == "agent_loop":
                trajs = asyncio.run(loop.arun(rows))
                s = {
                    "turns": statistics.mean(t.metrics["turns"] for t in trajs),
                    "searches": statistics.mean(t.metrics.get("searches", 0.0) for t in trajs),
                    "answered": statistics.mean(t.metrics.get("answers", 0.0) for t in trajs),
                    "generated_tokens": statistics.mean(t.metrics["model_tokens"] for t in trajs),
                    "response_tokens": statistics.mean(len(t.response_ids) for t in trajs),
                    "turns_at_limit": turns_at_limit(trajs, cfg.max_tokens_per_turn),
                }
            else:
                s = sync_batch_loop(engine, tok, rows, delayed, cfg, use_stop=name == "sync_batch_stop")
            elapsed = time.perf_counter() - t0
            s["retrieval_calls"] = delayed.calls
            s["prefilled_tokens"] = (engine.decode_stats.prefill_tokens - prefilled) / args.n
            s["reused_tokens"] = (engine.decode_stats.reused_tokens - reused) / args.n
            times[name].append(elapsed)
            stats[name] = s
            shown = {k: round(v, 2) for k, v in s.items()}
            print(f"  repeat {rep} {name:16s} {elapsed:6.2f} s  {args.n / elapsed:6.1f} traj/s  {shown}", flush=True)
            if s["searches"] == 0:
                raise SystemExit(
                    f"{name}: the model made no searches, so nothing was retrieved and the comparison is void; "
                    "raise --warmup-steps or lower --temperature"
                )
    engine.close()
    threaded.close()
    load_after = os.getloadavg()

    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"\n{args.n} SearchEnv trajectories, {args.latency_ms:.0f} ms per retrieval call, median of {args.repeats}")
    where = f"{args.threads} torch thread(s)" if args.device == "cpu" else args.device
    print(f"(T={args.temperature}, max_batch_rows={args.max_batch_rows}, {where}; ", end="")
    print(f"load average before {load_before[0]:.1f}, after {load_after[0]:.1f}; last repeat's stats):")
    print(
        "| method | traj/s | mean turns | mean searches | answered | sampled tokens | response tokens "
        "| retrieval calls | prompt tokens run / reused | AgentLoop speed-up |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name in times:
        s = stats[name]
        print(
            f"| {name} | {args.n / med[name]:.1f} | {s['turns']:.2f} | {s['searches']:.2f} | {s['answered']:.2f} | "
            f"{s['generated_tokens']:.0f} | {s['response_tokens']:.0f} | {s['retrieval_calls']:.0f} | "
            f"{s['prefilled_tokens']:.0f} / {s['reused_tokens']:.0f} | "
            f"{med[name] / med['agent_loop']:.2f}x |"
        )
    print(
        f"AgentLoop: {stats['agent_loop']['turns_at_limit']:.1%} of model turns ran to a length limit without closing "
        "a tag (each costs AgentLoop what it costs Search-R1's loop)"
    )
    print(f"engine: {engine.joins} joins into running batches, peak {engine.peak_batch_rows} rows per forward")
    # within a repeat the methods run the same conversations, so a repeat's own ratio is a paired measurement
    for name in ("search_r1", "sync_batch_stop"):
        paired = sorted(theirs / ours for theirs, ours in zip(times[name], times["agent_loop"], strict=True))
        print(
            f"{name} / agent_loop per repeat (paired): median {statistics.median(paired):.2f}x, "
            f"range {paired[0]:.2f}x-{paired[-1]:.2f}x over {len(paired)} repeats"
        )


if __name__ == "__main__":
    main()
