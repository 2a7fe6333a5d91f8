"""`search-agent demo`: a tiny model learns from reward to search a synthetic corpus, on CPU, in minutes.

Wiring only, with the real components: a word-level Qwen2 (rlloom.core_rl.tiny) gets a short supervised warm-up
on demonstration conversations (rlloom.core_rl's `supervised_train`) in which it searches only now and then (see
synthetic.py); then GRPO through rlloom.core_rl's trainer, with multi-turn `SearchEnv` rollouts (`AgentLoop` on an
`HFEngine` built on the actor's own module) against an rlloom-retrieval BM25 index of the corpus, rewarded by
exact match of the last `<answer>`. Held-out names are validated greedily before and during training. The run
folder holds the corpus and index, config.yaml, metrics.jsonl, a checkpoint, summary.json and before_after.md.

With `DemoSettings.model_path` (`search-agent demo --model DIR`) a pretrained checkpoint, such as
SmolLM2-135M-Instruct, takes the tiny model's place: the same world and protocol in its own tokenizer and chat
template, a shorter warm-up at a fine-tuning learning rate, and configs/demo_pretrained.yaml (smaller steps).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from rlloom_apps.search_agent.synthetic import ENV_CONFIG, Demonstrator, World, make_world
from torch import nn
from transformers import PreTrainedModel

from rlloom.agent import AgentLoop, AgentLoopConfig, SearchEnv, agent_collector, env_reward
from rlloom.core_rl import tiny_qwen2, train, word_tokenizer
from rlloom.core_rl.config import RLConfig, demo_overrides, load_config
from rlloom.core_rl.contracts import SamplingParams
from rlloom.core_rl.observe import read_curves
from rlloom.core_rl.run import fresh_run_dir
from rlloom.core_rl.workers import load_pretrained_tokenizer, supervised_train
from rlloom.retrieval import build_index, load_index
from rlloom.rollout import HFEngine

DEMO_CONFIG = Path(__file__).parent / "configs" / "demo.yaml"
PRETRAINED_CONFIG = Path(__file__).parent / "configs" / "demo_pretrained.yaml"
LOOP = AgentLoopConfig(max_turns=3, max_tokens_per_turn=8, max_obs_tokens=40, max_total_tokens=160)
"""A search, the passage, an answer: three turns of 8 tokens are plenty."""
PRETRAINED_LOOP = AgentLoopConfig(max_turns=3, max_tokens_per_turn=24, max_obs_tokens=64, max_total_tokens=320)
"""The same turns in a BPE vocabulary (`<search> zor bak </search>` is about 10 tokens) after a chat template's
system prompt."""


@dataclass(frozen=True)
class DemoSettings:
    """What the demo varies besides the trainer config: the model, warm-up and the world."""

    model_path: Path | None = None  # a pretrained checkpoint folder; None builds the tiny word-level Qwen2
    tokenizer_path: Path | None = None  # where model_path's tokenizer lives, when not in model_path
    hidden_size: int = 64  # of the tiny model
    num_layers: int = 2  # of the tiny model
    warmup_steps: int = 2500
    warmup_lr: float = 2e-3
    warmup_batch_size: int = 16
    search_share: float = 0.3  # demonstrations that search; the rest guess a code
    demonstrations_per_name: int = 4
    names: int = 400
    held_out: int = 80

    @property
    def pretrained(self) -> bool:
        return self.model_path is not None

    @property
    def loop(self) -> AgentLoopConfig:
        return PRETRAINED_LOOP if self.pretrained else LOOP


def pretrained_settings(model_path: Path, tokenizer_path: Path | None = None) -> DemoSettings:
    """A pretrained model already writes text and copies from its context: a short warm-up at a fine-tuning
    learning rate teaches it the protocol (and, like the tiny model, to search only now and then)."""
    return DemoSettings(
        model_path=model_path, tokenizer_path=tokenizer_path, warmup_steps=40, warmup_lr=3e-5, warmup_batch_size=8
    )


@dataclass(frozen=True)
class HeldOutScore:
    """Greedy conversations on the held-out names."""

    em: float  # share answered with the right code
    searches: float  # searches per question


@dataclass(frozen=True)
class DemoResult:
    output_dir: Path
    untrained: HeldOutScore
    before: HeldOutScore  # after the warm-up, before GRPO
    after: HeldOutScore  # after the last GRPO step
    warmup_steps: int
    grpo_steps: int
    val_curve: list[tuple[int, float]]  # (step, held-out EM)
    search_curve: list[tuple[int, float]]  # (step, held-out searches per question)
    train_curve: list[tuple[int, float]]  # (step, mean sampled reward)
    seconds: float


def demo_config(
    output_dir: Path, steps: int | None, seed: int, overrides: Sequence[str], *, pretrained: bool = False
) -> RLConfig:
    """configs/demo.yaml (demo_pretrained.yaml for a pretrained model), then the demo's own paths, seed and
    --steps, then the user's overrides (which win)."""
    model_dir, tokenizer_dir = output_dir / "warmup_model", output_dir / "tokenizer"
    own = demo_overrides(
        model_path=model_dir, output_dir=output_dir, seed=seed, steps=steps, tokenizer_path=tokenizer_dir
    )
    return load_config(PRETRAINED_CONFIG if pretrained else DEMO_CONFIG, [*own, *overrides])


def run_demo(
    *,
    output_dir: Path | None = None,
    steps: int | None = None,
    seed: int = 0,
    overrides: Sequence[str] = (),
    settings: DemoSettings = DemoSettings(),
) -> DemoResult:
    """Build the world, warm up, then GRPO with held-out validation; writes and returns the before/after scores."""
    started = time.perf_counter()
    output_dir = fresh_run_dir(output_dir, "search-demo")
    config = demo_config(output_dir, steps, seed, overrides, pretrained=settings.pretrained)  # fails before work
    torch.manual_seed(seed)
    world = make_world(seed, names=settings.names, held_out=settings.held_out)
    retriever = _index(world, output_dir)
    model, tokenizer = _model_and_tokenizer(settings, world, seed)
    # in its own folder: AutoTokenizer would read a tiny model's folder (a qwen2 config) as Qwen2's BPE
    tokenizer.save_pretrained(str(config.model.tokenizer_path))
    loop = settings.loop

    def make_env() -> SearchEnv:
        return SearchEnv(retriever, None, ENV_CONFIG)

    untrained = held_out_score(model, tokenizer, world, make_env, loop)
    demos = AgentLoop(
        Demonstrator(tokenizer, settings.search_share, seed),
        tokenizer,
        make_env,
        loop.model_copy(update={"sampling": SamplingParams(seed=seed), "compute_reward": False}),
    ).run(world.rows(world.train_names), n=settings.demonstrations_per_name)
    losses = supervised_train(
        model,
        demos,
        pad_token_id=_pad_id(tokenizer),
        steps=settings.warmup_steps,
        batch_size=settings.warmup_batch_size,
        lr=settings.warmup_lr,
        seed=seed,
    )
    if losses:
        print(f"warm-up: {len(losses)} steps on {len(demos)} demonstrations, loss {losses[0]:.3f} -> {losses[-1]:.3f}")
    model.save_pretrained(config.model.path)  # GRPO's starting point (and reference policy when a KL term is on)
    before = held_out_score(model, tokenizer, world, make_env, loop)

    engines: list[HFEngine] = []
    actors: list[nn.Module] = []

    def engine_on(module: nn.Module) -> HFEngine:
        """Rollouts sample the very weights being trained."""
        actors.append(module)
        engines.append(HFEngine(module, tokenizer))
        return engines[-1]

    try:
        train(
            config,
            engine=engine_on,
            collect_factory=agent_collector(tokenizer, make_env, loop),
            reward_fn=env_reward,
            train_data=world.rows(world.train_names),
            val_data=world.rows(world.held_out_names),
        )
    finally:
        for engine in engines:
            engine.close()
    after = held_out_score(actors[0], tokenizer, world, make_env, loop)
    val_curve, train_curve = read_curves(output_dir / "metrics.jsonl")
    search_curve, _ = read_curves(output_dir / "metrics.jsonl", "rollout/searches/mean")
    result = DemoResult(
        output_dir=output_dir,
        untrained=untrained,
        before=before,
        after=after,
        warmup_steps=len(losses),
        grpo_steps=len(train_curve),
        val_curve=val_curve,
        search_curve=search_curve,
        train_curve=train_curve,
        seconds=time.perf_counter() - started,
    )
    write_summary(result)
    return result


def _model_and_tokenizer(settings: DemoSettings, world: World, seed: int) -> tuple[PreTrainedModel, Any]:
    """The pretrained checkpoint and its tokenizer, or the tiny word-level Qwen2 on the world's vocabulary."""
    if settings.model_path is None:
        words = word_tokenizer(world.vocabulary())
        tiny = tiny_qwen2(
            words,
            hidden_size=settings.hidden_size,
            num_layers=settings.num_layers,
            seed=seed,
            max_position_embeddings=256,
        )
        return tiny, words
    from transformers import AutoModelForCausalLM

    for flag, folder in (("--model", settings.model_path), ("--tokenizer", settings.tokenizer_path)):
        if folder is not None and not Path(folder).is_dir():
            raise FileNotFoundError(f"{flag} {folder}: not a folder (a transformers checkpoint saved locally)")
    tokenizer = load_pretrained_tokenizer(str(settings.tokenizer_path or settings.model_path))
    if tokenizer.chat_template is None:
        raise ValueError(f"the tokenizer of {settings.model_path} has no chat template; pass an instruct model's")
    model: PreTrainedModel = AutoModelForCausalLM.from_pretrained(str(settings.model_path), dtype=torch.float32)
    return model, tokenizer


def _pad_id(tokenizer: Any) -> int:
    """Padding never carries loss, so any id does; many pretrained tokenizers have no pad token, then EOS."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    return int(pad)


def _index(world: World, output_dir: Path) -> Any:
    """The corpus as JSONL and its BM25 index in the run folder (no stopwords: syllables like "ban" are names)."""
    output_dir.mkdir(parents=True, exist_ok=True)
    corpus = output_dir / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(row) + "\n" for row in world.corpus()))
    return load_index(build_index(corpus, output_dir / "index", "bm25", stopwords="none"))


def held_out_score(
    model: nn.Module,
    tokenizer: Any,
    world: World,
    make_env: Callable[[], SearchEnv],
    loop: AgentLoopConfig = LOOP,
) -> HeldOutScore:
    """Greedy conversations on the held-out names, scored by the env's rubric (EM of the last answer)."""
    engine = HFEngine(model, tokenizer)
    try:
        greedy = loop.model_copy(update={"sampling": SamplingParams(temperature=0.0)})
        trajectories = AgentLoop(engine, tokenizer, make_env, greedy).run(world.rows(world.held_out_names))
    finally:
        engine.close()
    count = len(trajectories)
    return HeldOutScore(
        em=sum(t.reward or 0.0 for t in trajectories) / count,
        searches=sum(t.metrics.get("searches", 0.0) for t in trajectories) / count,
    )


def before_after_table(result: DemoResult) -> str:
    rows = [
        ("untrained", result.untrained),
        (f"after warm-up ({result.warmup_steps} steps) = before GRPO", result.before),
        (f"after GRPO ({result.grpo_steps} steps)", result.after),
    ]
    lines = ["| held-out names (greedy) | exact match | searches per question |", "|---|---|---|"]
    lines += [f"| {name} | {s.em:.2f} | {s.searches:.2f} |" for name, s in rows]
    lines.append(
        f"\nGRPO changed held-out exact match by {result.after.em - result.before.em:+.2f} and searches per "
        f"question by {result.after.searches - result.before.searches:+.2f} ({result.seconds:.0f} s in all)."
    )
    return "\n".join(lines)


def write_summary(result: DemoResult) -> None:
    """before_after.md (the table the CLI prints) and summary.json in the run folder."""
    (result.output_dir / "before_after.md").write_text(before_after_table(result) + "\n")
    summary = {
        "untrained": asdict(result.untrained),
        "before_grpo": asdict(result.before),
        "after_grpo": asdict(result.after),
        "warmup_steps": result.warmup_steps,
        "grpo_steps": result.grpo_steps,
        "val_curve": result.val_curve,
        "search_curve": result.search_curve,
        "seconds": round(result.seconds, 1),
    }
    (result.output_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
