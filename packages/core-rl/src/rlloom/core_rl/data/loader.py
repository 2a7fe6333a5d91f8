"""The prompt stream: a stateful loader whose position is part of every checkpoint.

Rows follow the veRL/Search-R1 shape: `prompt` (chat messages, or a plain string taken as one user message),
`data_source`, `reward_model.ground_truth`, `extra_info`; `prompt_ids` may replace `prompt`. Each epoch's order
is a permutation seeded by (seed, epoch) of the rows still in play, so the state to save is two integers and the
set of excluded rows (retired by online prompt filtering, `prompt_filter.py`), and a resumed run sees the same
prompts in the same order, including across an epoch boundary. Which rows come next is the loader's `sampler`
(`samplers.py`: that permutation by default, or `data.sampler`'s class, e.g. a curriculum), whose own state is
saved with the loader's.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from tqdm.auto import tqdm

from rlloom.core_rl.contracts.generation import GenerationRequest, SamplingParams
from rlloom.core_rl.contracts.prompts import render_prompt
from rlloom.core_rl.data.rows import DataError, JsonlRows, read_jsonl
from rlloom.core_rl.data.samplers import EpochSampler, PromptSampler

Row = Mapping[str, Any]
__all__ = ["DataError", "JsonlRows", "read_jsonl"]  # re-exported: where rows are read
logger = logging.getLogger(__name__)


def check_rows(rows: Sequence[Any], *, split: str, agent_rows: bool = False) -> None:
    """Refuse rows the collector cannot turn into a prompt, before any model loads.

    Single-turn sampling (the trainer's default collector) needs `prompt` (chat messages or a string) or
    `prompt_ids`; a collector of its own (an agent environment, image rows) also takes `question` (rows the
    environment renders). The error names the first bad row (`file:line` for `read_jsonl` rows, else its
    1-based position) and how many more there are.
    """
    bad = [(i, problem) for i, row in enumerate(rows) if (problem := _row_problem(row, agent_rows)) is not None]
    if not bad:
        return
    index, problem = bad[0]
    where = row_location(rows, index, split)
    more = f" ({len(bad) - 1} more {split} rows have problems)" if len(bad) > 1 else ""
    fields = "`prompt` (chat messages or a string) or `prompt_ids`" + (" or `question`" if agent_rows else "")
    raise DataError(
        f"{where}: {problem}{more}; each {split} row needs {fields}, in the veRL row shape (make rows with the "
        "app's prepare-data command)"
    )


def row_location(rows: Sequence[Any], index: int, split: str) -> str:
    """Where row `index` is: `file:line` for rows from `read_jsonl`, else its 1-based position in the split."""
    return rows.where(index) if isinstance(rows, JsonlRows) else f"{split} row {index + 1} of {len(rows)}"


def _row_problem(row: Any, agent_rows: bool) -> str | None:
    if not isinstance(row, Mapping):
        return f"the row is a {type(row).__name__}, not a mapping of fields"
    if "prompt_ids" in row:
        ids = row["prompt_ids"]
        ok = isinstance(ids, Sequence) and not isinstance(ids, str) and len(ids) > 0
        return None if ok else "`prompt_ids` is not a non-empty list of token ids"
    if row.get("prompt") is None:
        if agent_rows and row.get("question") is not None:
            return None
        wanted = "'prompt' nor 'question'" if agent_rows else "'prompt'"
        return f"the row has no {wanted} (its fields: {', '.join(sorted(map(str, row))) or 'none'})"
    try:
        prompt_messages(row)
    except ValueError as err:
        return str(err)
    return None


def prompt_messages(row: Row) -> list[dict[str, Any]] | None:
    """A row's `prompt` as chat messages, the one reading every collector shares: chat messages (a list, or the
    numpy object array parquet gives) as they are, a plain string as one user message (TRL's standard format);
    None when the row has no `prompt`. Anything else raises `ValueError` saying what the prompt holds."""
    prompt = row.get("prompt")
    if prompt is None:
        return None
    if isinstance(prompt, str):
        if not prompt:
            raise ValueError("`prompt` is an empty string")
        return [{"role": "user", "content": prompt}]
    if not isinstance(prompt, Mapping) and hasattr(prompt, "__len__") and hasattr(prompt, "__iter__") and len(prompt):
        for message in prompt:
            if not isinstance(message, Mapping) or "role" not in message or "content" not in message:
                raise ValueError(f"`prompt` holds {message!r:.80}, not a chat message with 'role' and 'content'")
        return [dict(m) for m in prompt]
    raise ValueError(f"`prompt` is {type(prompt).__name__} {prompt!r:.80}, not chat messages or a string")


class PromptLoader:
    """Yields batches of `batch_size` rows forever, epoch after epoch (the prompts, and the PPO-ptx rows).

    `sampler` decides which rows (default: `EpochSampler(shuffle=shuffle, seed=seed)`, every row once per epoch);
    the loader keeps the epoch and position, `drop_last`, the excluded rows, and checks the sampler's answers.
    """

    def __init__(
        self,
        rows: Sequence[Row],
        batch_size: int,
        *,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        source: str = "the training data",
        sampler: PromptSampler | None = None,
    ) -> None:
        if not rows:
            raise DataError(f"PromptLoader: {source} has no rows")
        if drop_last and batch_size > len(rows):  # a DataError: the apps report it as one line, not a traceback
            raise DataError(
                f"data.train_batch_size={batch_size} exceeds the {len(rows)} training rows and data.drop_last "
                "is set, so no batch could be formed; lower the batch size or set data.drop_last=false"
            )
        self.rows = rows
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.source = source  # what the rows are, for errors (the PPO-ptx rows use a loader of their own)
        self.epoch = 0
        self.position = 0  # rows of the current epoch already served
        self.excluded: frozenset[int] = frozenset()  # row indices left out of every epoch from now on
        self.sampler: PromptSampler = sampler if sampler is not None else EpochSampler(rows, seed=seed, shuffle=shuffle)

    @property
    def active_ids(self) -> list[int]:
        """Indices of the rows still served, in data order."""
        return [i for i in range(len(self.rows)) if i not in self.excluded]

    @property
    def batches_per_epoch(self) -> int:
        full, rest = divmod(len(self.active_ids), self.batch_size)
        return full + (1 if rest and not self.drop_last else 0)

    @property
    def epoch_finished(self) -> bool:
        """True when the next batch starts a new epoch (the moment to change `excluded`)."""
        remaining = len(self.active_ids) - self.position
        return remaining <= 0 or (self.drop_last and remaining < self.batch_size)

    def next_batch(self) -> list[Row]:
        """The next batch; the last batch of an epoch may be smaller (unless drop_last), then a new epoch starts."""
        return [self.rows[i] for i in self.next_batch_ids()]

    def next_batch_ids(self) -> list[int]:
        """Like `next_batch`, as row indices into the training data."""
        if self.epoch_finished:
            self.epoch += 1
            self.position = 0
        active = self.active_ids
        count = min(self.batch_size, len(active) - self.position)
        picked = [int(i) for i in self.sampler.next_ids(active, epoch=self.epoch, position=self.position, count=count)]
        if len(picked) != count or not set(picked) <= set(active):
            strays = sorted(set(picked) - set(active))[:5]
            problem = f"row ids {strays} that are not in play" if strays else f"{len(picked)} row ids"
            raise RuntimeError(
                f"{type(self.sampler).__name__}.next_ids was asked for {count} of the {len(active)} active rows "
                f"(epoch {self.epoch}, position {self.position}) and returned {problem}; it must return exactly "
                "`count` ids taken from `active`"
            )
        self.position += len(picked)
        return picked

    def exclude(self, ids: Iterable[int]) -> None:
        """Leave rows out of every later epoch; only between epochs, since the order of an epoch depends on it."""
        if self.position != 0 and not self.epoch_finished:
            raise RuntimeError(
                f"PromptLoader.exclude: epoch {self.epoch} is in progress ({self.position} rows served); exclude "
                "rows only when `epoch_finished` is true, so the epoch's order does not change under it"
            )
        ids = frozenset(ids)
        unknown = sorted(i for i in ids if not 0 <= i < len(self.rows))
        if unknown:
            raise IndexError(f"PromptLoader.exclude: row indices {unknown[:5]} are outside 0..{len(self.rows) - 1}")
        self.excluded = self.excluded | ids

    def state_dict(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "position": self.position,
            "num_rows": len(self.rows),
            "excluded": sorted(self.excluded),
            "sampler_class": _class_name(self.sampler),
            "sampler": copy.deepcopy(self.sampler.state_dict()),  # a snapshot: off-policy keeps it while drawing on
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if state.get("num_rows", len(self.rows)) != len(self.rows):
            raise DataError(
                f"PromptLoader: the checkpoint was taken over {state['num_rows']} rows but {self.source} now has "
                f"{len(self.rows)}; resume with the same {self.source.removeprefix('the ')} or start a new run in a "
                "new trainer.output_dir"
            )
        self.epoch = int(state["epoch"])
        self.position = int(state["position"])
        self.excluded = frozenset(int(i) for i in state.get("excluded", ()))
        saved_class = state.get("sampler_class")
        if saved_class is None:  # a checkpoint from before samplers: only the default sampler existed, stateless
            return
        if saved_class != _class_name(self.sampler):
            logger.warning(
                "the checkpoint's prompt sampler was %s, this run's is %s: its state is not restored, the new sampler "
                "starts fresh (at the checkpoint's epoch and position)",
                saved_class,
                _class_name(self.sampler),
            )
            return
        self.sampler.load_state_dict(state["sampler"])


def _class_name(obj: object) -> str:
    return type(obj).__qualname__  # not the module: a sampler file loaded from another folder is the same class


def generation_request(
    row: Row, sampling: SamplingParams, chat_template_kwargs: Mapping[str, Any] | None = None
) -> GenerationRequest:
    """The engine request for one data row (chat messages, a plain string, or token ids); `chat_template_kwargs`
    (`data.apply_chat_template_kwargs`) go to the chat template that renders the messages."""
    if "prompt_ids" in row:
        return GenerationRequest(prompt_ids=list(row["prompt_ids"]), sampling=sampling)
    messages = prompt_messages(row)
    if messages is None:
        raise ValueError(f"data row has no usable 'prompt' (chat messages or a string) nor 'prompt_ids': {dict(row)!r}")
    return GenerationRequest(
        messages=messages, sampling=sampling, chat_template_kwargs=dict(chat_template_kwargs or {})
    )


def ground_truth(row: Row) -> Any:
    """The row's gold answer, the one reading every collector shares: `reward_model.ground_truth` (veRL shape), a
    top-level `ground_truth`, or a flat QA row's `golden_answers` (Search-R1, NQ) or `answer`."""
    reward_model = row.get("reward_model")
    if isinstance(reward_model, Mapping) and reward_model.get("ground_truth") is not None:
        return reward_model["ground_truth"]
    for key in ("ground_truth", "golden_answers", "answer"):
        if row.get(key) is not None:
            return row[key]
    return None


def limit_prompt_length(
    rows: Sequence[Row],
    tokenizer: Any,
    max_length: int,
    *,
    drop: bool,
    split: str = "train",
    chat_template_kwargs: Mapping[str, Any] | None = None,
) -> list[Row]:
    """veRL's `data.max_prompt_length`: the rows whose prompt, rendered as the engine renders it, fits.

    Image rows are measured after image expansion by rlloom-multimodal (`QwenVLProcessing.max_prompt_tokens`),
    not here: their text alone would undercount them.
    """
    sampling = SamplingParams()

    def length_of(row: Row) -> int:
        if row.get("images"):
            raise DataError(
                "it has images: data.max_prompt_length counts text prompts only; limit image rows after image "
                "expansion with rlloom.multimodal's QwenVLProcessing.max_prompt_tokens"
            )
        try:
            request = generation_request(row, sampling, chat_template_kwargs)
        except ValueError as err:
            raise DataError(
                f"{err}. data.max_prompt_length measures `prompt` or `prompt_ids`; rows an agent environment renders "
                "(no `prompt`) are limited by AgentLoopConfig.max_total_tokens instead"
            ) from err
        return len(render_prompt(tokenizer, request))

    return rows_that_fit(
        rows,
        length_of,
        max_length,
        drop=drop,
        split=split,
        limit_name=f"data.max_prompt_length={max_length}",
        fix="raise the limit, shorten the prompt, or set data.filter_overlong_prompts=true to leave such rows out",
    )


def rows_that_fit(
    rows: Sequence[Row],
    length_of: Callable[[Row], int],
    limit: int,
    *,
    drop: bool,
    split: str,
    limit_name: str,
    fix: str,
) -> list[Row]:
    """The rows whose prompt, measured by `length_of` (tokens, as the collector will render it), is at most `limit`:
    every prompt-length limit (the trainer's `data.max_prompt_length`, an agent's conversation budget) in one way.

    With `drop` (veRL's `filter_overlong_prompts`) longer rows are left out and counted in a warning; without it the
    first one raises a `DataError` naming the row (`file:line` for `read_jsonl` rows) and `limit_name`, so a run
    never stops hours in on a prompt the model cannot take. `length_of` may raise `DataError` or `ValueError` about
    a row; the error then names the row.
    """
    kept: list[Row] = []
    for index, row in enumerate(tqdm(rows, desc=f"{split} prompt lengths", disable=len(rows) < 20_000)):
        try:
            length = length_of(row)
        except (DataError, ValueError) as err:
            raise DataError(f"{row_location(rows, index, split)}: {err}") from err
        if length <= limit:
            kept.append(row)
        elif not drop:
            raise DataError(
                f"{row_location(rows, index, split)}: the prompt is {length} tokens, over {limit_name}; {fix}"
            )
    if len(kept) < len(rows):
        logger.warning(
            "left out %d of %d %s rows whose prompt is over %s", len(rows) - len(kept), len(rows), split, limit_name
        )
    if rows and not kept:
        raise DataError(f"every {split} row is over {limit_name}; raise the limit")
    return kept
