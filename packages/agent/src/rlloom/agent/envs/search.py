"""`SearchEnv`: Search-R1's protocol, with its defaults, on any rlloom-retrieval retriever.

The model writes `<search> query </search>`; generation stops right there (a stop string, so nothing past the
tag is sampled or trained on); the environment retrieves top-k passages and appends
`\n\n<information>Doc 1(Title: ...) text\nDoc 2...</information>\n\n` inside the same assistant turn;
`<answer> ... </answer>` ends the episode; any other turn gets Search-R1's corrective text. A search on the
turn the loop ends the episode after (`last_turn`) is not run. Search-R1 reads
only the first `<search>`/`<answer>` block of a turn, and so do we. Retrieval is awaited, so while one
conversation waits for its passages the others keep generating: a sync retriever (in-process BM25) runs in a
worker thread, an async HTTP client is awaited directly.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from rlloom.agent.environment import Observation, Prompt, Sample, StepResult
from rlloom.agent.envs.single_turn import chat_messages
from rlloom.agent.parsers import XMLParser, first_action
from rlloom.agent.rewards import AgentRubric, EpisodeSummary
from rlloom.core_rl.contracts.protocols import RewardOutput
from rlloom.core_rl.contracts.trajectory import Trajectory
from rlloom.rewards.qa import qa_em_scorer

SEARCH_R1_TEMPLATE = (
    "Answer the given question. You must conduct reasoning inside <think> and </think> first every time you get "
    "new information. After reasoning, if you find you lack some knowledge, you can call a search engine by "
    "<search> query </search> and it will return the top searched results between <information> and "
    "</information>. You can search as many times as your want. If you find no further external knowledge "
    "needed, you can directly provide the answer inside <answer> and </answer>, without detailed illustrations. "
    "For example, <answer> Beijing </answer>. Question: {question}\n"
)
"""Search-R1's `make_prefix` (scripts/data_process/nq_search.py), verbatim."""

SEARCH_R1_INVALID_ACTION = (
    "\nMy previous action is invalid. If I want to search, I should put the query between <search> and "
    "</search>. If I want to give the final answer, I should put the answer between <answer> and </answer>. "
    "Let me try again.\n"
)
"""Search-R1's corrective observation for a turn with neither a search nor an answer, verbatim."""

PassageFormatter = Callable[[Sequence[Any]], str]

SEARCH_METRICS = ("searches", "search_errors", "search_latency_s", "invalid_actions", "answers", "searches_skipped")
"""Counters every `SearchEnv.step` reports (zeros included), so `rollout/searches/mean` is logged as 0 on a step
where nobody searched instead of missing from metrics.jsonl (a gap at the start of every learning curve)."""


def _counts(**values: float) -> dict[str, float]:
    return {**dict.fromkeys(SEARCH_METRICS, 0.0), **values}


class ThreadedRetriever:
    """Gives a blocking retriever an `asearch` that runs on its own thread pool.

    asyncio's default pool has only `cpu_count + 4` threads, so hundreds of conversations waiting on a slow
    (remote, or rate-limited) sync retriever would queue behind a handful of threads. Build one and share it.
    """

    def __init__(self, retriever: Any, *, max_threads: int = 64) -> None:
        if not callable(getattr(retriever, "search", None)):
            raise TypeError(f"ThreadedRetriever: {type(retriever).__name__} has no `search(queries, k)` method")
        self.retriever = retriever
        self._pool = ThreadPoolExecutor(max_workers=max_threads, thread_name_prefix="rlloom-search")

    def search(self, queries: Sequence[str], k: int) -> Any:
        return self.retriever.search(queries, k)

    async def asearch(self, queries: Sequence[str], k: int) -> Any:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, self.retriever.search, list(queries), k)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


class SearchEnvConfig(BaseModel):
    """Search-R1's protocol knobs; every default is Search-R1's."""

    model_config = ConfigDict(extra="forbid")

    template: str = Field(default=SEARCH_R1_TEMPLATE, description="User prompt; `{question}` is filled in.")
    system_prompt: str | None = Field(default=None, description="Optional system message before the prompt.")
    add_question_mark: bool = Field(default=True, description="Append '?' to questions lacking one (Search-R1).")
    search_tag: str = Field(default="search", description="Tag whose content is the search query.")
    answer_tag: str = Field(default="answer", description="Tag whose content is the final answer (ends episode).")
    think_tag: str = Field(default="think", description="Reasoning tag (only used by the format check).")
    information_tag: str = Field(default="information", description="Tag wrapping the retrieved passages.")
    top_k: int = Field(default=3, ge=1, description="Passages per search (Search-R1 trains with 3).")
    doc_template: str = Field(
        default="Doc {rank}(Title: {title}) {text}\n",
        description="One passage; fields: rank (1-based), title (quoted, Search-R1's first line), text, doc_id, score.",
    )
    invalid_action_text: str = Field(default=SEARCH_R1_INVALID_ACTION, description="Observation for a bad turn.")
    stop_at_answer: bool = Field(
        default=True, description="Also stop generation at the closing answer tag (nothing after it is sampled)."
    )
    search_timeout_s: float = Field(default=60.0, gt=0, description="A search slower than this is an error.")


def search_prompt(sample: Sample, config: SearchEnvConfig) -> Prompt:
    """The prompt `SearchEnv.reset` opens a conversation with (no retriever needed: apps measure prompts with it
    before an index loads): the row's own chat messages, else `config.template` around its question."""
    if sample.prompt is not None:
        return Prompt(messages=chat_messages(sample, system_prompt=config.system_prompt))
    question = (sample.question or "").strip()
    if not question:
        raise ValueError("SearchEnv: sample has an empty question and no prompt messages")
    if config.add_question_mark and not question.endswith("?"):
        question += "?"
    probe = sample.model_copy(update={"question": question})
    return Prompt(messages=chat_messages(probe, system_prompt=config.system_prompt, template=config.template))


class SearchEnv:
    """One Search-R1 conversation against a shared retriever; by default rewarded by EM of the last `<answer>`
    (rlloom-rewards' `qa_em_scorer`, F1 and subEM logged as components)."""

    def __init__(
        self,
        retriever: Any,
        rubric: AgentRubric | None = None,
        config: SearchEnvConfig | None = None,
        *,
        format_passages: PassageFormatter | None = None,
    ) -> None:
        if not callable(getattr(retriever, "search", None)) and not callable(getattr(retriever, "asearch", None)):
            raise TypeError(
                f"SearchEnv: retriever {type(retriever).__name__} has no `search(queries, k)` or `asearch` method; "
                "pass an rlloom.retrieval retriever or client"
            )
        self.retriever = retriever
        self.rubric = rubric if rubric is not None else AgentRubric(qa_em_scorer)
        self.config = config or SearchEnvConfig()
        self.format_passages = format_passages or self._format_passages
        cfg = self.config
        self._parser = XMLParser([cfg.think_tag, cfg.search_tag, cfg.information_tag, cfg.answer_tag])
        self._sample: Sample | None = None
        self._actions: list[str] = []
        self._well_formed = 0
        self._answered = False

    @property
    def stop(self) -> list[str]:
        cfg = self.config
        stops = [f"</{cfg.search_tag}>"]
        if cfg.stop_at_answer:
            stops.append(f"</{cfg.answer_tag}>")
        return stops

    def reset(self, sample: Sample) -> Prompt:
        self._sample = sample
        return search_prompt(sample, self.config)

    async def step(self, action: str, *, last_turn: bool = False) -> StepResult:
        cfg = self.config
        self._actions.append(action)
        # Format is judged per turn (balanced, un-nested tags); an episode that never answers scores 0 on it.
        self._well_formed += int(self._parser.parse(action).format_ok)
        found = first_action(action, (cfg.search_tag, cfg.answer_tag))
        if found is None:
            return StepResult(Observation(text=cfg.invalid_action_text), False, _counts(invalid_actions=1.0))
        tag, content = found
        if tag == cfg.answer_tag:
            self._answered = True
            return StepResult(None, True, _counts(answers=1.0))
        if last_turn:  # Search-R1's final rollout does not search either: nobody would read the passages
            return StepResult(None, False, _counts(searches_skipped=1.0))
        t0 = time.perf_counter()
        try:
            hits = await asyncio.wait_for(self._search(content), cfg.search_timeout_s)
        except Exception as exc:  # a failed search is shown to the model, the rollout goes on
            info = _counts(searches=1.0, search_errors=1.0, search_latency_s=time.perf_counter() - t0)
            text = f"Search failed: {type(exc).__name__}: {exc}"
            if isinstance(exc, TimeoutError) and not str(exc):  # wait_for's own timeout carries no message
                text = f"Search failed: no results within {cfg.search_timeout_s} s"
            return StepResult(self._information(text), False, info)
        info = _counts(searches=1.0, search_latency_s=time.perf_counter() - t0)
        return StepResult(self._information(self.format_passages(hits).strip()), False, info)

    async def reward(self, trajectory: Trajectory) -> RewardOutput:
        if self._sample is None:
            raise RuntimeError("SearchEnv.reward called before reset()")
        episode = EpisodeSummary(
            model_text="".join(self._actions),
            ground_truth=self._sample.ground_truth,
            extra_info=self._sample.extra_info,
            turns_well_formed=self._well_formed if self._answered else 0,
            turns=len(self._actions),
        )
        return await self.rubric.ascore(episode)

    # -- retrieval -----------------------------------------------------------------------------------------
    def _information(self, body: str) -> Observation:
        tag = self.config.information_tag
        return Observation(text=body, before=f"\n\n<{tag}>", after=f"</{tag}>\n\n")

    async def _search(self, query: str) -> list[Any]:
        k = self.config.top_k
        asearch = getattr(self.retriever, "asearch", None)
        if asearch is not None and inspect.iscoroutinefunction(asearch):
            results = await asearch([query], k)
        elif inspect.iscoroutinefunction(self.retriever.search):
            results = await self.retriever.search([query], k)
        else:
            results = await asyncio.to_thread(self.retriever.search, [query], k)
        return list(results[0])

    def _format_passages(self, hits: Sequence[Any]) -> str:
        """Search-R1's `_passages2string`: title = first line of `contents` (quoted), text = the rest."""
        parts = []
        for i, h in enumerate(hits):
            title, text = search_r1_title_and_text(h)
            parts.append(
                self.config.doc_template.format(
                    rank=i + 1, title=title, text=text, doc_id=getattr(h, "doc_id", ""), score=getattr(h, "score", 0.0)
                )
            )
        return "".join(parts)


def search_r1_title_and_text(hit: Any) -> tuple[str, str]:
    """Split a hit the way Search-R1 splits `contents`: the first line (the quoted title) and the rest."""
    contents = getattr(hit, "contents", None)
    if not isinstance(contents, str):
        title = getattr(hit, "title", None)
        text = str(getattr(hit, "text", ""))
        contents = f'"{title}"\n{text}' if title is not None else text
    lines = contents.split("\n")
    return lines[0], "\n".join(lines[1:])
