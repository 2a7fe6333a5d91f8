"""rlloom scorers as TRL reward functions: `GRPOTrainer(reward_funcs=[trl_reward("gsm8k")], ...)`.

TRL calls each reward function as `fn(prompts=..., completions=..., completion_ids=..., **columns)`, where
`columns` are the dataset's other columns, one value per completion, plus `trainer_state`, `log_extra` and
`log_metric`; it wants one float per completion back (None means "does not apply"). Completions are strings for
plain-text datasets and message lists (`[{"role": "assistant", "content": ...}]`, more messages after tool calls)
for conversational ones. The ground truth comes from a column (`ground_truth`, or veRL-shaped rows'
`reward_model["ground_truth"]`); the scorer is fixed, or chosen per row by its `data_source` column through the
registry. Async scorers (LLM judges) score the whole batch concurrently. A scorer failure scores 0 and is
counted in the `<name>/scoring_errors` metric; each component of the score is logged as `<name>/<component>`
(its mean over the completions that have it).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

from rlloom.rewards.integrations.scoring import ScorerLike, resolve, score_async, score_now
from rlloom.rewards.registry import is_async_scorer
from rlloom.rewards.types import ScoreResult

# keyword arguments TRL adds itself; everything else is a dataset column
_TRAINER_KEYS = frozenset({"trainer_state", "log_extra", "log_metric", "environments", "completion_ids"})


def _content_text(content: Any) -> str:
    """A message's text: a string, or the text parts of a content list (multimodal messages)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        return "".join(
            str(part.get("text", "")) for part in content if isinstance(part, Mapping) and part.get("type") == "text"
        )
    return str(content)


def completion_text(completion: Any, *, turns: Literal["last", "all"] = "last") -> str:
    """The text to score of one TRL completion: the string itself, or, for a list of messages, the last
    assistant message's text (`turns="last"`) or every message's text joined by newlines (`turns="all"`:
    a multi-turn trajectory with its tool results, as Search-R1's format reward reads it)."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, Mapping):  # a single message
        return _content_text(completion.get("content"))
    if isinstance(completion, Sequence):
        messages = [m for m in completion if isinstance(m, Mapping)]
        if turns == "all":
            return "\n".join(_content_text(m.get("content")) for m in messages)
        replies = [m for m in messages if m.get("role") == "assistant"]
        return _content_text(replies[-1].get("content")) if replies else ""
    raise TypeError(
        f"a TRL completion is a string or a list of chat messages, got {type(completion).__name__}; "
        "pass the completions TRL gives the reward function unchanged"
    )


class TRLReward:
    """A TRL reward function over an rlloom scorer; build it with `trl_reward`. Picklable when its scorer is given
    by name (TRL may copy reward functions to worker processes)."""

    def __init__(
        self,
        scorer: ScorerLike | None = None,
        *,
        name: str | None = None,
        ground_truth_column: str = "ground_truth",
        data_source_column: str = "data_source",
        extra_info_column: str = "extra_info",
        turns: Literal["last", "all"] = "last",
    ) -> None:
        if turns not in ("last", "all"):
            raise ValueError(f"turns must be 'last' or 'all', got {turns!r}")
        if scorer is not None and not isinstance(scorer, str) and not callable(scorer):
            raise TypeError(f"scorer must be a registry name, 'module:function' or a callable, got {scorer!r}")
        if isinstance(scorer, str):
            resolve(scorer, None, how="")  # an unknown name fails here, not at the first training step
        self.scorer = scorer
        self.ground_truth_column = ground_truth_column
        self.data_source_column = data_source_column
        self.extra_info_column = extra_info_column
        self.turns = turns
        if scorer is None:
            default = "by_data_source"
        else:
            default = scorer if isinstance(scorer, str) else getattr(scorer, "__name__", type(scorer).__name__)
        # TRL names each reward function's metric `rewards/<__name__>/mean`
        self.__name__ = name or f"rlloom_{str(default).rsplit(':', 1)[-1].rsplit('/', 1)[-1]}"

    def _ground_truths(self, columns: Mapping[str, Any], n: int) -> list[Any]:
        if self.ground_truth_column in columns:
            values = list(columns[self.ground_truth_column])
        elif "reward_model" in columns:  # veRL / Search-R1 rows: reward_model = {"ground_truth": ...}
            values = [rm.get("ground_truth") if isinstance(rm, Mapping) else None for rm in columns["reward_model"]]
        else:
            present = sorted(k for k in columns if k not in _TRAINER_KEYS)
            raise ValueError(
                f"{self.__name__}: no {self.ground_truth_column!r} column among the dataset columns TRL passed "
                f"({present}); name the answer column with trl_reward(..., ground_truth_column='answer') or add a "
                "veRL-style 'reward_model' column"
            )
        if len(values) != n:
            raise ValueError(f"{self.__name__}: {len(values)} ground truths for {n} completions")
        return values

    def _column(self, columns: Mapping[str, Any], key: str, n: int) -> list[Any]:
        values = columns.get(key)
        return list(values) if values is not None else [None] * n

    def score(self, prompts: Sequence[Any], completions: Sequence[Any], **columns: Any) -> list[ScoreResult]:
        """Every completion's full `ScoreResult` (what `__call__` reduces to floats)."""
        n = len(completions)
        if len(prompts) != n:
            raise ValueError(f"{self.__name__}: {len(prompts)} prompts for {n} completions")
        truths = self._ground_truths(columns, n)
        sources = self._column(columns, self.data_source_column, n)
        infos = self._column(columns, self.extra_info_column, n)
        how = f"pass trl_reward(scorer=...) or add a {self.data_source_column!r} column (e.g. 'gsm8k') to the dataset"
        jobs = []
        for completion, truth, source, info in zip(completions, truths, sources, infos, strict=True):
            fn, name = resolve(self.scorer, source, how=how)
            text = completion_text(completion, turns=self.turns)
            jobs.append((fn, name, text, truth, info if isinstance(info, Mapping) else None))
        if any(is_async_scorer(job[0]) for job in jobs):  # LLM judges: all the batch's requests in flight at once

            async def gather() -> list[ScoreResult]:
                return list(await asyncio.gather(*(score_async(*job) for job in jobs)))

            return asyncio.run(gather())
        return [score_now(*job) for job in jobs]

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], **columns: Any) -> list[float]:
        results = self.score(prompts, completions, **columns)
        log_metric = columns.get("log_metric")
        if callable(log_metric) and results:
            self._log(log_metric, results)
        return [r.score for r in results]

    def _log(self, log_metric: Callable[[str, float], None], results: list[ScoreResult]) -> None:
        sums: dict[str, list[float]] = {}
        for result in results:
            for key, value in result.components.items():
                sums.setdefault(key, []).append(value)
        for key, values in sorted(sums.items()):
            log_metric(f"{self.__name__}/{key}", sum(values) / len(values))
        log_metric(f"{self.__name__}/scoring_errors", sum(r.error is not None for r in results) / len(results))


def trl_reward(
    scorer: ScorerLike | None = None,
    *,
    name: str | None = None,
    ground_truth_column: str = "ground_truth",
    data_source_column: str = "data_source",
    extra_info_column: str = "extra_info",
    turns: Literal["last", "all"] = "last",
) -> TRLReward:
    """A TRL `reward_funcs` entry scoring with `scorer` (a registry name such as "gsm8k", "module:function", a
    `Rubric` or any scorer callable), or, with `scorer=None`, with each row's `data_source` scorer.

    `name` is the reward's name in TRL's logs (default `rlloom_<scorer>`); `turns` which part of a
    conversational completion is scored (see `completion_text`).
    """
    return TRLReward(
        scorer,
        name=name,
        ground_truth_column=ground_truth_column,
        data_source_column=data_source_column,
        extra_info_column=extra_info_column,
        turns=turns,
    )
