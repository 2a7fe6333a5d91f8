"""`search-agent warmup`: a cold start on real rows before RL, by supervised learning on format demonstrations.

GRPO learns only from groups whose rewards differ. A small instruct model given Search-R1's prompt on real rows
(SmolLM2-135M on HotpotQA) wrote no `<search>` and no `<answer>` in a whole step: every reward was equal, so
nothing was learned. The demos learn because they warm up first; this is that warm-up for real rows.

Each demonstration is a real conversation run through `AgentLoop` with the real environment and retriever, so
its token ids, chat-template glue and observations are exactly what RL will send the model: the demonstrator
searches the question, the retriever's passages come back in `<information>`, and the demonstrator answers the
row's first gold answer, in Search-R1's tag format (think -> search -> information -> think -> answer).
Training is core-rl's `supervised_train` on the loss-mask-1 tokens only (the model's turns; prompt and passages
are context).

Why demonstrations and not rejection sampling from the model itself: rejection sampling keeps the model's own
valid, correct conversations, and a model that never writes the tags has none to keep (0 of every group above).
Demonstrations need no such start. They teach the format and the habit of searching; the answers' content
is RL's to learn, so keep the warm-up short (its loss falls quickly; the format is what matters) and measure
it with `--val-data` rows never trained on: format validity, EM, F1 and searches before and after.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from rlloom_apps.search_agent.format_reward import FormatRewardSearchEnv
from rlloom_apps.search_agent.settings import FormatRewardSettings
from rlloom_apps.search_agent.warmup_settings import WarmupSettings
from torch import nn

from rlloom.agent import AgentLoop, Sample, SearchEnv, SearchEnvConfig
from rlloom.core_rl.contracts import Completion, GenerationRequest, Trajectory
from rlloom.core_rl.workers import supervised_train
from rlloom.rewards.qa import qa_golds
from rlloom.rollout import HFEngine

SEARCH_TURN = "<think> I need to search for this. </think>\n<search> {query} </search>"
ANSWER_TURN = "<think> The documents answer it. </think>\n<answer> {answer} </answer>"


@dataclass
class Demonstrator:
    """A `RolloutEngine` for one conversation: its first turn searches `query`, any later turn answers `answer`."""

    tokenizer: Any
    query: str
    answer: str
    turns: int = 0

    async def agenerate(self, request: GenerationRequest) -> list[Completion]:
        if request.prompt_ids is None:
            raise ValueError("Demonstrator needs token-id prompts (AgentLoop sends them)")
        final = self.turns > 0
        text = (ANSWER_TURN if final else SEARCH_TURN).format(query=self.query, answer=self.answer)
        self.turns += 1
        ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        if final:  # the conversation ends here, as a sampled EOS would end it
            ids.append(int(self.tokenizer.eos_token_id))
        finish: Literal["stop", "length"] = "stop"
        if len(ids) > request.sampling.max_tokens:
            ids, finish = ids[: request.sampling.max_tokens], "length"
        return [Completion(request.request_id, list(request.prompt_ids), ids, text, finish, [0.0] * len(ids))]

    def generate(self, requests: Sequence[GenerationRequest]) -> list[list[Completion]]:
        raise NotImplementedError("Demonstrator serves AgentLoop, which calls agenerate")

    def update_weights(self, named_tensors: Any) -> None:
        raise NotImplementedError("Demonstrator has no weights")


def row_query(sample: Sample, where: str) -> str:
    """The bare question a demonstration searches for: the row's `question`, else prepare-data's
    `extra_info.question`."""
    question = sample.question or sample.extra_info.get("question")
    if not isinstance(question, str) or not question.strip():
        raise ValueError(
            f"{where}: no question to search for (needs 'question' or extra_info.question, as "
            "`search-agent prepare-data` writes)"
        )
    return question.strip()


def demonstrations(
    rows: Sequence[dict[str, Any]],
    tokenizer: Any,
    retriever: Any,
    settings: WarmupSettings,
) -> list[Trajectory]:
    """One demonstration per row: search the question, read the passages, answer the first gold answer."""
    env_config = SearchEnvConfig(top_k=settings.top_k)
    loop_config = settings.loop_config(max_turns=2).model_copy(
        update={"compute_reward": False, "progress": False, "max_tokens_per_turn": settings.max_total_tokens}
    )
    out: list[Trajectory] = []
    for i, row in enumerate(rows[: settings.max_rows]):
        sample = Sample.from_row(row)
        golds = qa_golds(sample.ground_truth)
        if not golds:
            raise ValueError(f"--train-data row {i}: no gold answer to demonstrate")
        engine = Demonstrator(tokenizer, row_query(sample, f"--train-data row {i}"), golds[0])
        loop = AgentLoop(engine, tokenizer, lambda: SearchEnv(retriever, None, env_config), loop_config)
        out.extend(loop.run([row]))
    return out


@dataclass(frozen=True)
class FormatScore:
    """Held-out means over greedy conversations."""

    format_valid: float  # Search-R1's valid think -> (search -> information -> think)* -> answer sequence
    em: float
    f1: float
    searches: float
    rows: int

    def line(self) -> str:
        return (
            f"valid format {self.format_valid:.2f}, EM {self.em:.2f}, F1 {self.f1:.2f}, "
            f"searches {self.searches:.2f} ({self.rows} rows)"
        )


def format_score(
    model: nn.Module, tokenizer: Any, rows: Sequence[dict[str, Any]], retriever: Any, settings: WarmupSettings
) -> FormatScore:
    """Greedy conversations on `rows`, read by the format reward's segments (only the model's text counts)."""
    env_config = SearchEnvConfig(top_k=settings.top_k)
    engine = HFEngine(model, tokenizer)
    try:
        loop = AgentLoop(
            engine,
            tokenizer,
            lambda: FormatRewardSearchEnv(retriever, None, env_config, format_reward=FormatRewardSettings()),
            settings.loop_config(),
        )
        trajectories = loop.run(list(rows))
    finally:
        engine.close()
    count = max(len(trajectories), 1)

    def mean(read: Callable[[Trajectory], float]) -> float:
        return sum(read(t) for t in trajectories) / count

    return FormatScore(
        format_valid=mean(lambda t: t.reward_components.get("format_valid", 0.0)),
        em=mean(lambda t: t.reward_components.get("em", 0.0)),
        f1=mean(lambda t: t.reward_components.get("f1", 0.0)),
        searches=mean(lambda t: t.metrics.get("searches", 0.0)),
        rows=len(trajectories),
    )


@dataclass(frozen=True)
class WarmupResult:
    losses: list[float]
    demonstrations: int
    before: FormatScore | None
    after: FormatScore | None


def warm_up(
    model: nn.Module,
    tokenizer: Any,
    train_rows: Sequence[dict[str, Any]],
    retriever: Any,
    settings: WarmupSettings,
    *,
    val_rows: Sequence[dict[str, Any]] | None = None,
) -> WarmupResult:
    """Measure on `val_rows` (if any), train `model` in place on demonstrations of `train_rows`, measure again."""
    before = format_score(model, tokenizer, val_rows, retriever, settings) if val_rows else None
    demos = demonstrations(train_rows, tokenizer, retriever, settings)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    losses = supervised_train(
        model,
        demos,
        pad_token_id=int(pad),
        steps=settings.steps,
        batch_size=settings.batch_size,
        lr=settings.lr,
        seed=settings.seed,
        progress=settings.progress,
        max_tokens_per_micro_batch=settings.max_tokens_per_micro_batch,
        gradient_checkpointing=settings.gradient_checkpointing,
    )
    model.eval()
    after = format_score(model, tokenizer, val_rows, retriever, settings) if val_rows else None
    return WarmupResult(losses=losses, demonstrations=len(demos), before=before, after=after)
