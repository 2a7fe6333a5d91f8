"""Where per-step metrics go: the console (rich), `metrics.jsonl`, TensorBoard, Weights & Biases.

Each tracker implements the `Tracker` protocol. The JSONL file is the run's record: one line per step, and on
resume the lines after the checkpoint's step are dropped, so a killed-and-resumed run leaves the same file as an
uninterrupted one.
"""

from __future__ import annotations

import json
import math
import os
import secrets
import string
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from rlloom.core_rl.contracts.protocols import GenerationTracker, Tracker

CONSOLE_KEYS = (
    ("reward/mean", "reward"),
    ("response_length/mean", "len"),
    ("actor/pg_loss", "pg"),
    ("actor/kl_mean", "kl"),
    ("actor/entropy", "ent"),
    ("actor/pg_clipfrac", "clip"),
    ("actor/grad_norm", "gnorm"),
    ("val/reward/mean", "val"),
    ("perf/tokens_per_s", "tok/s"),
)

SAMPLE_COLUMNS = ("data_source", "prompt", "response", "ground_truth", "reward")
"""The columns of a sample table (`trainer.log_val_generations`), in order."""

PROMPT_CHARS, RESPONSE_CHARS = 300, 600
"""How much of a prompt (its end: shared templates come first, the question last) and of a response (its start)
a console or TensorBoard table shows; the JSONL dumps and the W&B table keep the whole text."""


class ConsoleTracker:
    """A progress bar over the run's steps and one compact line per step."""

    def __init__(self, total_steps: int, start_step: int = 0, console: Console | None = None) -> None:
        self.console = console or Console(stderr=True)
        self.progress = Progress(
            TextColumn("[bold]train"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=self.console,
            transient=True,
        )
        self.task = self.progress.add_task("train", total=total_steps, completed=start_step)
        self.progress.start()

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        parts = [f"step {step}"]
        for key, short in CONSOLE_KEYS:
            if key in metrics:
                parts.append(f"{short} {metrics[key]:.4g}")
        self.progress.console.print(" | ".join(parts))
        self.progress.update(self.task, completed=step)

    def log_config(self, config: Mapping[str, Any]) -> None:
        import yaml

        self.progress.console.print(yaml.safe_dump(dict(config), sort_keys=False))

    def log_generations(self, records: Sequence[Mapping[str, Any]], step: int, *, title: str) -> None:
        from rich.table import Table

        table = Table(title=f"{title}, step {step}", show_lines=True, expand=True)
        for column in SAMPLE_COLUMNS:
            table.add_column(column, overflow="fold", ratio=3 if column in ("prompt", "response") else 1)
        for row in _sample_rows(records, clip=True):
            table.add_row(*row)
        self.progress.console.print(table)

    def close(self) -> None:
        self.progress.stop()


class JSONLTracker:
    """Appends `{"step": N, ...metrics}` lines to `metrics.jsonl`; drops lines past `resume_step` first.

    `resume_step=0` (a fresh start: no checkpoint to keep lines for) drops them all, step-0 validation lines of an
    earlier attempt included, so the file never holds two step-0 records.
    """

    def __init__(self, path: str | Path, resume_step: int | None = None) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.exists():
            kept = []
            for line in self.path.read_text().splitlines():
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    continue  # a line torn by a crash mid-write
                if resume_step and int(record.get("step", 0)) <= resume_step:
                    kept.append(line)
            partial = self.path.with_name(f".{self.path.name}.tmp")  # a kill mid-rewrite keeps the old file
            partial.write_text("".join(f"{line}\n" for line in kept))
            os.replace(partial, self.path)
        self._file = self.path.open("a")

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        record = {"step": step, **{k: json_number(v) for k, v in metrics.items()}}
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()

    def log_config(self, config: Mapping[str, Any]) -> None:
        return None  # the config is saved as config.yaml next to this file

    def close(self) -> None:
        self._file.close()


class TensorBoardTracker:
    """Scalars to a TensorBoard event file (extra `tensorboard`).

    With `resume_step`, the events an earlier attempt wrote after that step are purged (TensorBoard's
    `purge_step`), as `JSONLTracker` drops its lines: otherwise the abandoned steps and the resumed ones would
    both be plotted, a zig-zag at every step logged twice. `resume_step=0` (a fresh start) purges everything.
    """

    def __init__(self, log_dir: str | Path, resume_step: int | None = None) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as err:  # pragma: no cover - depends on the extra
            raise ImportError("the tensorboard tracker needs: pip install 'rlloom-core-rl[tensorboard]'") from err
        purge_step = None if resume_step is None else (resume_step + 1 if resume_step > 0 else 0)
        self.writer = SummaryWriter(log_dir=str(log_dir), purge_step=purge_step)

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, global_step=step)
        self.writer.flush()

    def log_config(self, config: Mapping[str, Any]) -> None:
        import yaml

        self.writer.add_text("config", f"```yaml\n{yaml.safe_dump(dict(config), sort_keys=False)}\n```")

    def log_generations(self, records: Sequence[Mapping[str, Any]], step: int, *, title: str) -> None:
        def cell(text: str) -> str:  # a markdown table cell: no line breaks, no column separators
            return text.replace("|", "\\|").replace("\n", "<br>")

        lines = ["| " + " | ".join(SAMPLE_COLUMNS) + " |", "|" + "---|" * len(SAMPLE_COLUMNS)]
        lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in _sample_rows(records, clip=True)]
        self.writer.add_text(title, "\n".join(lines), global_step=step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


WANDB_ID_FILE = "wandb_run_id"
"""The run folder's record of its W&B run id: a resumed run logs into the same W&B run, not a new one."""


def wandb_run_id(output_dir: str | Path) -> str:
    """The id this run folder's W&B run has, made and written on first use (8 lowercase letters and digits,
    the form W&B's own ids take)."""
    path = Path(output_dir) / WANDB_ID_FILE
    if path.is_file() and (saved := path.read_text(encoding="utf-8").strip()):
        return saved
    alphabet = string.ascii_lowercase + string.digits
    made = "".join(secrets.choice(alphabet) for _ in range(8))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(made + "\n", encoding="utf-8")
    return made


class WandbTracker:
    """Weights & Biases (extra `wandb`); honours WANDB_MODE=offline for machines without network. The W&B run id
    lives in the run folder, so resuming the folder continues the same W&B run (`resume="allow"`)."""

    def __init__(self, project: str, run_name: str, output_dir: str | Path, config: Mapping[str, Any]) -> None:
        try:
            import wandb
        except ImportError as err:
            raise ImportError("the wandb tracker needs: pip install 'rlloom-core-rl[wandb]'") from err
        self.run = wandb.init(
            project=project,
            name=run_name,
            dir=str(output_dir),
            config=dict(config),
            mode=os.environ.get("WANDB_MODE", "online"),  # type: ignore[arg-type]
            id=wandb_run_id(output_dir),
            resume="allow",
        )

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        self.run.log(dict(metrics), step=step)

    def log_config(self, config: Mapping[str, Any]) -> None:
        self.run.config.update(dict(config), allow_val_change=True)

    def log_generations(self, records: Sequence[Mapping[str, Any]], step: int, *, title: str) -> None:
        import wandb

        table = wandb.Table(columns=list(SAMPLE_COLUMNS), data=[list(row) for row in _sample_rows(records)])
        self.run.log({title: table}, step=step)

    def close(self) -> None:
        self.run.finish()


class MultiTracker:
    """Fans every call out to several trackers."""

    def __init__(self, trackers: Sequence[Tracker]) -> None:
        self.trackers = list(trackers)

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        for tracker in self.trackers:
            tracker.log(metrics, step)

    def log_config(self, config: Mapping[str, Any]) -> None:
        for tracker in self.trackers:
            tracker.log_config(config)

    def log_generations(self, records: Sequence[Mapping[str, Any]], step: int, *, title: str) -> None:
        """To the trackers that show samples (metrics.jsonl does not: the JSONL dumps hold them)."""
        for tracker in self.trackers:
            if isinstance(tracker, GenerationTracker):
                tracker.log_generations(records, step, title=title)

    def close(self) -> None:
        """Close every tracker even if one fails (a failing wandb upload must not leave metrics.jsonl unflushed),
        then raise the first failure."""
        first: BaseException | None = None
        for tracker in self.trackers:
            try:
                tracker.close()
            except Exception as exc:
                first = first or exc
        if first is not None:
            raise first


def _sample_rows(records: Sequence[Mapping[str, Any]], *, clip: bool = False) -> list[tuple[str, ...]]:
    """Each record's `SAMPLE_COLUMNS` as text; with `clip`, long prompts keep their end and responses their start."""
    rows: list[tuple[str, ...]] = []
    for record in records:
        prompt, response = str(record.get("prompt", "")), str(record.get("response", ""))
        if clip and len(prompt) > PROMPT_CHARS:
            prompt = "..." + prompt[-PROMPT_CHARS:]
        if clip and len(response) > RESPONSE_CHARS:
            response = response[:RESPONSE_CHARS] + f"... (+{len(response) - RESPONSE_CHARS} chars)"
        reward = record.get("reward")
        rows.append(
            (
                str(record.get("data_source", "")),
                prompt,
                response,
                json.dumps(record.get("ground_truth"), ensure_ascii=False),
                "" if reward is None else f"{reward:.4g}" if isinstance(reward, float) else str(reward),
            )
        )
    return rows


def json_number(value: float) -> float | str:
    """`value` as JSON holds it: a float, or its text for nan/inf (JSON has no such numbers)."""
    value = float(value)
    return value if math.isfinite(value) else str(value)  # JSON has no NaN/inf
