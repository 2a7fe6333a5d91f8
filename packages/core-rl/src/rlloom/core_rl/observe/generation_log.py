"""What the model wrote: each step's trajectories as JSONL files and sample tables for the trackers.

A reward curve says that something changed, not what: researchers read the generations themselves (is the
model reward hacking, looping, truncated?). veRL writes them with `trainer.rollout_data_dir` and
`trainer.validation_data_dir` (one `<step>.jsonl` per step) and shows `trainer.log_val_generations` samples in
its loggers; TRL has `log_completions`. We keep veRL's names and file layout, with self-explaining fields:

    {"step", "split", "group_id", "data_source", "prompt", "response", "ground_truth", "reward",
     "reward_components", "reward_error", "advantage", "finish_reason", "response_tokens", "sampled_tokens",
     "metrics"}

(veRL's `input`/`output`/`score`/`gts` are our `prompt`/`response`/`reward`/`ground_truth`.)
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from transformers import PreTrainedTokenizerBase

from rlloom.core_rl.contracts.trajectory import Trajectory
from rlloom.core_rl.data.rows import write_jsonl
from rlloom.core_rl.observe.trackers import json_number

GenerationRecord = dict[str, Any]
"""One trajectory as written: the fields listed in the module docstring."""

_STEP_FILE = re.compile(r"^(\d+)\.jsonl$")


def readable_text(tokenizer: PreTrainedTokenizerBase, token_ids: Sequence[int]) -> str:
    """`token_ids` decoded with special tokens kept (chat-template turns stay visible), except that a run of one
    repeated special token (a vision model's hundreds of image placeholders, padding) is written once with its
    count, e.g. `<|image_pad|>x256`."""
    special = set(tokenizer.all_special_ids)
    pieces: list[str] = []
    plain: list[int] = []
    i = 0
    while i < len(token_ids):
        token = token_ids[i]
        run = 1
        while i + run < len(token_ids) and token_ids[i + run] == token:
            run += 1
        if token in special and run > 1:
            if plain:
                pieces.append(str(tokenizer.decode(plain, skip_special_tokens=False)))
                plain = []
            pieces.append(f"{tokenizer.convert_ids_to_tokens(int(token))}x{run}")
        else:
            plain.extend([token] * run)
        i += run
    if plain:
        pieces.append(str(tokenizer.decode(plain, skip_special_tokens=False)))
    return "".join(pieces)


def generation_records(
    trajectories: Sequence[Trajectory],
    tokenizer: PreTrainedTokenizerBase,
    *,
    step: int,
    split: str,
    advantages: Sequence[float | None] | None = None,
) -> list[GenerationRecord]:
    """One JSON-ready record per trajectory, in order.

    `advantages` (train only) holds each trajectory's mean advantage over its sampled tokens, None for one with no
    sampled token.
    """
    if advantages is not None and len(advantages) != len(trajectories):
        raise ValueError(f"generation_records: {len(advantages)} advantages for {len(trajectories)} trajectories")
    prompts: dict[str, str] = {}  # the n samples of a prompt share its group id: decode it once
    records = []
    for i, traj in enumerate(trajectories):
        prompt = traj.prompt_text or (prompts.get(traj.group_id, "") if traj.group_id else "")
        if not prompt:
            prompt = readable_text(tokenizer, traj.prompt_ids)
            if traj.group_id:
                prompts[traj.group_id] = prompt
        records.append(
            {
                "step": step,
                "split": split,
                "group_id": traj.group_id,
                "data_source": traj.data_source,
                "prompt": prompt,
                "response": traj.response_text or readable_text(tokenizer, traj.response_ids),
                "ground_truth": traj.ground_truth,
                "reward": _json_number(traj.reward),
                "reward_components": {k: _json_number(v) for k, v in traj.reward_components.items()},
                "reward_error": traj.reward_error,
                "advantage": _json_number(advantages[i]) if advantages is not None else None,
                "finish_reason": traj.finish_reason,
                "response_tokens": len(traj.response_ids),
                "sampled_tokens": traj.num_model_tokens,
                "metrics": {k: _json_number(v) for k, v in traj.metrics.items()},
            }
        )
    return records


class GenerationDump:
    """Writes `<directory>/<step>.jsonl` for each step it is given.

    A resumed run redoes the steps after its checkpoint, so on start the files of later steps (an abandoned
    attempt's) are deleted, as metrics.jsonl drops its lines; a fresh start (`start_step=0`) deletes every step
    file. Only files named `<number>.jsonl` are touched.
    """

    def __init__(self, directory: str | Path, *, start_step: int) -> None:
        self.directory = Path(directory)
        if self.directory.exists() and not self.directory.is_dir():
            raise NotADirectoryError(f"{self.directory} is a file; a generation dump needs a directory path")
        self.directory.mkdir(parents=True, exist_ok=True)
        for path in self.directory.iterdir():
            match = _STEP_FILE.match(path.name)
            if match and (start_step == 0 or int(match.group(1)) > start_step):
                path.unlink()

    def write(self, step: int, records: Sequence[GenerationRecord]) -> Path:
        """Write (or replace) step `step`'s file atomically; returns its path."""
        path = self.directory / f"{step}.jsonl"
        write_jsonl(path, records)
        return path


def _json_number(value: float | None) -> float | str | None:
    return None if value is None else json_number(value)


def record_validation(
    trajectories: Sequence[Trajectory],
    tokenizer: PreTrainedTokenizerBase,
    step: int,
    *,
    dump: GenerationDump | None,
    tracker: Any,
    shown: int,
) -> None:
    """A validation's generations: all of them to `trainer.validation_data_dir`, and the first `shown`
    (`trainer.log_val_generations`) as a table on the trackers; the same validation rows come first every time,
    so the table shows how answers change."""
    if dump is None and not shown:
        return
    records = generation_records(trajectories, tokenizer, step=step, split="validation")
    if dump is not None:
        dump.write(step, records)
    if shown:
        tracker.log_generations(records[:shown], step, title="val/generations")
