"""`search-agent eval`: exact match per data source, laid out like Search-R1's results table (paper v5, Table 2).

Three methods, each a row of the table, all greedy by default (Search-R1 validates with `do_sample=False`); with
`n` > 1 (sampled) each question runs n conversations in the same agent-loop run, each its own record, and every
figure is the mean over all of them (avg@n), which narrows a per-question mean's noise n-fold in variance:
- `search`: the agent itself, Search-R1's prompt and protocol through `AgentLoop` + `SearchEnv` (top-k passages
  per `<search>`, up to `max_turns` model turns);
- `rag`: retrieve top-k passages for the question once, put them in the prompt, one answer turn (the paper's RAG
  row);
- `direct`: the question alone, one answer turn (the paper's "Direct inference" row).
Every method is scored the same way: the last `<answer>` of what the model wrote, normalised exact match against
any gold alias (rlloom-rewards' `qa_em_scorer`, Search-R1's `qa_em`), with F1 and cover-EM (`sub_em`) kept per row.
A row whose prompt alone fills the conversation's token budget is not run: it scores 0 with finish reason
`overlong_prompt` and is counted per source (`overlong`).
Columns follow the paper: NQ, TriviaQA, PopQA, HotpotQA, 2Wiki, Musique, Bamboogle, then the unweighted mean.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

from rlloom_apps.search_agent.data import search_r1_question
from rlloom_apps.search_agent.eval_settings import EvalSettings

from rlloom.agent import AgentLoop, AgentRubric, Sample, SearchEnv, SearchEnvConfig, SingleTurnEnv
from rlloom.core_rl import Trajectory
from rlloom.rewards.qa import extract_tagged_answer, qa_em_scorer, qa_golds

Method = Literal["search", "rag", "direct"]
METHODS: tuple[Method, ...] = ("search", "rag", "direct")
OVERLONG = "overlong_prompt"
"""Finish reason of a row whose prompt alone fills the conversation's token budget: not run, scored 0."""

TABLE_COLUMNS = {
    "nq": "NQ",
    "triviaqa": "TriviaQA",
    "popqa": "PopQA",
    "hotpotqa": "HotpotQA",
    "2wikimultihopqa": "2Wiki",
    "musique": "Musique",
    "bamboogle": "Bamboogle",
}
"""Search-R1's column order (general QA, then multi-hop QA); other data sources follow, alphabetically."""

# Search-R1's own baseline prompts, word for word (template_type "base"): `direct` from
# scripts/data_process/nq.py, `rag` from scripts/data_process/nq_rag.py, whose context is its `format_reference`
# (one "Doc i(Title: t) text\n" line per passage, unstripped), the passage text `SearchEnv.format_passages` makes.
DIRECT_TEMPLATE = (
    "Answer the given question. "
    "You should first have a reasoning process in mind and then provides the answer. "
    "Show your reasoning in <think> </think> tags and return the final answer in <answer> </answer> tags, "
    "for example <answer> Beijing </answer>. "
    "Question: {question}\n"
)
RAG_TEMPLATE = (
    "Answer the given question with some potentially useful context. "
    "You should analyze the question carefully, evaluate the given context (which may or may not be useful), "
    "and then generate an accurate and well-reasoned response. "
    "You should first have a reasoning process in mind and then provides the answer. "
    "Show your reasoning in <think> </think> tags and return the final answer in <answer> </answer> tags, "
    "for example <answer> Beijing </answer>. "
    "Question: {question} Context: {documents} \n"
)


@dataclass(slots=True)
class RowResult:
    """One evaluated question: what the model answered and how it scored."""

    data_source: str
    index: Any
    question: str
    golds: list[str]
    prediction: str | None  # the last <answer>, None when the model never wrote one
    em: float
    f1: float
    sub_em: float
    searches: float
    turns: float
    finish_reason: str  # "stop", "length", "max_turns", or "overlong_prompt" (not run: see `evaluate`)
    response: str
    error: str | None = None  # the scorer's error, when scoring failed (the row then scores 0)
    token_budget: int | None = None  # the conversation's tokens: --max-total-tokens capped by the model's context
    sample: int = 0  # which of the question's --n conversations (0 .. n-1)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def row_question(row: Mapping[str, Any]) -> str:
    """The bare question of a prepared row: `extra_info.question`, a flat `question`, or parsed from the prompt."""
    extra = row.get("extra_info") or {}
    if isinstance(extra, Mapping) and extra.get("question"):
        return str(extra["question"])
    if row.get("question"):
        return str(row["question"])
    prompt = row.get("prompt")
    if isinstance(prompt, list) and prompt:
        content = str(prompt[-1].get("content", ""))
        if "Question: " in content:
            return content.rsplit("Question: ", 1)[1].strip()
    raise ValueError(
        "row has no question: expected extra_info.question, a 'question' field, or a prompt ending in "
        "'Question: ...' (rows from `search-agent prepare-data` have all three)"
    )


async def evaluate(
    engine: Any,
    tokenizer: Any,
    rows: Sequence[Mapping[str, Any]],
    method: Method,
    settings: EvalSettings,
    *,
    retriever: Any = None,
) -> list[RowResult]:
    """Run `method` over `rows` (prepared rows: prompt, reward_model.ground_truth, data_source) and score each
    conversation: `settings.n` per row, in row order, seeded by the agent loop (conversation c = i * n + k)."""
    if method not in METHODS:
        raise ValueError(f"method {method!r} is not one of {', '.join(METHODS)}")
    if method != "direct" and retriever is None:
        raise ValueError(f"method {method!r} needs a retriever (--index DIR or --retrieval-url URL)")
    samples = [Sample.from_row(r) for r in rows]
    for i, sample in enumerate(samples):  # before any generation: a bad gold would only surface at scoring
        try:
            qa_golds(sample.ground_truth)
        except (TypeError, ValueError) as err:
            raise ValueError(f"row {i} ({sample.data_source}): bad reward_model.ground_truth: {err}") from err
    if settings.fallback_to_text:  # read by rlloom-rewards' QA scorers
        samples = [s.model_copy(update={"extra_info": {**s.extra_info, "fallback_to_text": True}}) for s in samples]
    questions = [row_question(r) for r in rows]
    rubric = AgentRubric(qa_em_scorer)
    loop_config = settings.loop_config(max_turns=None if method == "search" else 1)
    search_config = SearchEnvConfig(top_k=settings.top_k)
    if method == "search":
        loop = AgentLoop(engine, tokenizer, lambda: SearchEnv(retriever, rubric, search_config), loop_config)
    else:
        if method == "rag":
            formatter = SearchEnv(retriever, rubric, search_config).format_passages  # Search-R1's passage text
            hits = retriever.search(questions, settings.top_k)
            prompts = [
                RAG_TEMPLATE.format(documents=formatter(h), question=search_r1_question(q))
                for h, q in zip(hits, questions, strict=True)
            ]
        else:
            prompts = [DIRECT_TEMPLATE.format(question=search_r1_question(q)) for q in questions]
        samples = [
            s.model_copy(update={"prompt": [{"role": "user", "content": p}], "question": None})
            for s, p in zip(samples, prompts, strict=True)
        ]
        loop = AgentLoop(engine, tokenizer, lambda: SingleTurnEnv(rubric, stop=["</answer>"]), loop_config)
    fits = [_prompt_tokens(loop, s) < loop.max_total_tokens for s in samples]
    n = settings.n
    trajectories = iter(await loop.arun([s for s, ok in zip(samples, fits, strict=True) if ok], n=n))
    budget = loop.max_total_tokens
    return [
        _row_result(next(trajectories), q, tokenizer, settings.fallback_to_text, budget, sample=k)
        if ok
        else _overlong(s, q, budget, k=k)
        for s, q, ok in zip(samples, questions, fits, strict=True)
        for k in range(n)
    ]


def _prompt_tokens(loop: AgentLoop, sample: Sample) -> int:
    """The prompt's length as the agent loop renders it: a prompt that fills the conversation's whole token budget
    (a RAG prompt with long passages on a short-context model) makes the loop refuse it, so it is not run."""
    return len(loop.template.prompt_ids(loop.make_env().reset(sample)))


def _overlong(sample: Sample, question: str, budget: int, *, k: int) -> RowResult:
    """A row whose prompt does not fit the conversation: scored 0 and reported, never dropped (each of its n
    records, so every question weighs the same in the means)."""
    return RowResult(
        data_source=sample.data_source,
        index=sample.extra_info.get("index"),
        question=question,
        golds=qa_golds(sample.ground_truth),
        prediction=None,
        em=0.0,
        f1=0.0,
        sub_em=0.0,
        searches=0.0,
        turns=0.0,
        finish_reason=OVERLONG,
        response="",
        token_budget=budget,
        sample=k,
    )


def _row_result(
    traj: Trajectory, question: str, tokenizer: Any, fallback_to_text: bool, budget: int, *, sample: int
) -> RowResult:
    components = traj.reward_components
    written = model_text(traj, tokenizer)
    prediction = extract_tagged_answer(written)
    if prediction is None and fallback_to_text:
        prediction = written.strip()
    return RowResult(
        data_source=traj.data_source,
        index=traj.extra_info.get("index"),
        question=question,
        golds=qa_golds(traj.ground_truth),
        prediction=prediction,
        em=components.get("outcome/em", 0.0),
        f1=components.get("outcome/f1", 0.0),
        sub_em=components.get("outcome/sub_em", 0.0),
        searches=traj.metrics.get("searches", 0.0),
        turns=traj.metrics.get("turns", 0.0),
        finish_reason=traj.finish_reason,
        response=traj.response_text,
        error=traj.reward_error,
        token_budget=budget,
        sample=sample,
    )


def model_text(traj: Trajectory, tokenizer: Any) -> str:
    """What the model itself wrote (its turns, not the observations between them), as the reward reads it."""
    turns: list[list[int]] = []
    previous = 0
    for token, mask in zip(traj.response_ids, traj.loss_mask, strict=True):
        if mask and not previous:
            turns.append([])
        if mask:
            turns[-1].append(token)
        previous = mask
    return "".join(tokenizer.decode(ids, skip_special_tokens=True) for ids in turns)


# --------------------------------------------------------------------------------------------- the table
def source_scores(results: Sequence[RowResult]) -> dict[str, dict[str, float]]:
    """Per data source, in the table's column order: mean EM, F1, cover-EM and searches over every conversation,
    the question count `n`, conversations per question `samples`, and the conversations that did not run
    (`overlong`) or failed scoring."""
    by_source: dict[str, list[RowResult]] = {}
    for r in results:
        by_source.setdefault(r.data_source, []).append(r)
    out: dict[str, dict[str, float]] = {}
    for source in ordered_sources(by_source):
        group = by_source[source]
        out[source] = {
            "em": statistics.fmean(r.em for r in group),
            "f1": statistics.fmean(r.f1 for r in group),
            "sub_em": statistics.fmean(r.sub_em for r in group),
            "searches": statistics.fmean(r.searches for r in group),
            "n": float(sum(r.sample == 0 for r in group)),
            "samples": float(max(r.sample for r in group) + 1),
            "overlong": float(sum(r.finish_reason == OVERLONG for r in group)),
            "scoring_errors": float(sum(r.error is not None for r in group)),
        }
    return out


def problems_report(method: str, results: Sequence[RowResult], max_total_tokens: int) -> list[str]:
    """Warning lines for rows that scored 0 without a real answer: prompts too long to run, scoring errors."""
    lines = []
    questions = [r for r in results if r.sample == 0]  # a prompt's fit is the same for each of its samples
    overlong = [r for r in questions if r.finish_reason == OVERLONG]
    if overlong:
        # the budget the rows really ran under: a model with a shorter context caps --max-total-tokens
        budget = min((r.token_budget for r in overlong if r.token_budget is not None), default=max_total_tokens)
        cause = (
            f"--max-total-tokens {max_total_tokens}"
            if budget >= max_total_tokens
            else f"the model's context; --max-total-tokens {max_total_tokens} cannot raise it"
        )
        lines.append(
            f"WARNING: --method {method}: {len(overlong)} of {len(questions)} prompts do not fit a conversation "
            f"({budget} tokens: {cause}); they scored 0 with finish_reason '{OVERLONG}'. Lower --top-k or use a "
            "model with a longer context."
        )
    errors = [r.error for r in results if r.error is not None]
    if errors:
        shown = "; ".join(repr(e[:200]) for e in list(dict.fromkeys(errors))[:3])
        lines.append(
            f"WARNING: --method {method}: {len(errors)} of {len(results)} conversations had scoring errors: {shown}"
        )
    return lines


def ordered_sources(sources: Sequence[str] | Mapping[str, Any]) -> list[str]:
    known = [s for s in TABLE_COLUMNS if s in sources]
    return known + sorted(s for s in sources if s not in TABLE_COLUMNS)


def markdown_table(scores: Mapping[str, Mapping[str, Mapping[str, float]]], metric: str = "em") -> str:
    """One row per method, one column per data source, then Avg. (unweighted over sources, as in the paper); the
    header says avg@n when the figures are means over n sampled conversations per question."""
    sources = ordered_sources({s: None for per in scores.values() for s in per})
    n = max((int(cell.get("samples", 1)) for per in scores.values() for cell in per.values()), default=1)
    header = ["Method" if n == 1 else f"Method (avg@{n})", *(TABLE_COLUMNS.get(s, s) for s in sources), "Avg."]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for method, per in scores.items():
        cells = [f"{per[s][metric]:.3f}" if s in per else "-" for s in sources]
        mean = statistics.fmean(per[s][metric] for s in sources if s in per) if per else 0.0
        lines.append("| " + " | ".join([method, *cells, f"{mean:.3f}"]) + " |")
    return "\n".join(lines)
