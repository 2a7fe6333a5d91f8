"""Where a run starts: a fresh `trainer.output_dir`, or a checkpoint to resume, and the config it runs under.

`trainer.resume=never` refuses a folder that already holds a run, whose checkpoints, `latest` pointer and
`metrics.jsonl` would otherwise mix with the new run's; a `trainer.resume` path must be a complete checkpoint.
Resuming says so in one line and warns about every config change that alters training (`old → new`); the
previous `config.yaml` is kept as `config.step_N.yaml` rather than overwritten.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from rlloom.core_rl.config.schema import ConfigError, RLConfig
from rlloom.core_rl.run.checkpoint import STATE_FILE, latest_checkpoint

logger = logging.getLogger(__name__)

# Keys a resumed run may change without a warning: the run's length, where and how often it saves, validates
# and logs. Anything else (lr, batch sizes, the algorithm, the model, ...) changes what is trained.
RESUME_SAFE_KEYS = frozenset(
    {
        "trainer.total_steps",
        "trainer.total_epochs",
        "trainer.resume",
        "trainer.output_dir",
        "trainer.save_every",
        "trainer.keep_last",
        "trainer.trackers",
        "trainer.project",
        "trainer.run_name",
        "trainer.rollout_data_dir",
        "trainer.validation_data_dir",
        "trainer.log_val_generations",
    }
)
RESUME_SAFE_PREFIXES = ("trainer.val_", "rollout.val_")


def resume_checkpoint(cfg: RLConfig, output_dir: Path) -> Path | None:
    """The checkpoint `trainer.resume` asks for (None: start fresh); refusals are `ConfigError`s naming the keys."""
    resume = cfg.trainer.resume
    if resume == "auto":
        return latest_checkpoint(output_dir / "checkpoints")
    if resume == "never":
        found = previous_run(output_dir)
        if found:
            raise ConfigError(
                f"trainer.output_dir={output_dir} already holds a run ({', '.join(found)}) and trainer.resume=never "
                "would mix the two (old checkpoints stay and the new ones are pruned against them); use a new "
                "trainer.output_dir, or trainer.resume=auto to continue that run"
            )
        return None
    path = Path(resume)
    if not path.is_dir():
        raise ConfigError(
            f"trainer.resume: {resume} is not a directory; give a checkpoint folder (e.g. "
            f"{output_dir / 'checkpoints' / 'step_100'}), auto (the latest in trainer.output_dir) or never"
        )
    if not (path / STATE_FILE).is_file():
        raise ConfigError(
            f"trainer.resume: {resume} is not a complete checkpoint ({STATE_FILE} is missing); give a "
            "checkpoints/step_N folder, auto or never"
        )
    return path


def previous_run(output_dir: Path) -> list[str]:
    """What in `output_dir` belongs to an earlier run: checkpoints and a non-empty metrics.jsonl."""
    found = []
    checkpoints = output_dir / "checkpoints"
    if checkpoints.is_dir():
        found += sorted(p.name for p in checkpoints.iterdir() if p.name == "latest" or p.name.startswith("step_"))
    metrics = output_dir / "metrics.jsonl"
    if metrics.is_file() and metrics.stat().st_size > 0:
        found.append("metrics.jsonl")
    return found


def config_changes(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
    """`(dotted key, old, new)` for every leaf that differs, except `RESUME_SAFE_KEYS` and keys only one side has
    (a field added or removed between versions)."""
    flat_old, flat_new = _flatten(old), _flatten(new)
    changed = []
    for key in flat_new:
        if key in RESUME_SAFE_KEYS or key.startswith(RESUME_SAFE_PREFIXES) or key not in flat_old:
            continue
        if flat_old[key] != flat_new[key]:
            changed.append((key, flat_old[key], flat_new[key]))
    return changed


def record_config(cfg: RLConfig, output_dir: Path, *, resume_from: Path | None, step: int) -> None:
    """Write `config.yaml`; when resuming, announce it, warn about training changes and keep the old file."""
    output_dir.mkdir(parents=True, exist_ok=True)
    current = output_dir / "config.yaml"
    text = cfg.to_yaml()
    if resume_from is not None:
        print(f"resuming from {resume_from} (step {step})", file=sys.stderr, flush=True)
        saved = resume_from / "config.yaml"
        saved = saved if saved.is_file() else current
        old = yaml.safe_load(saved.read_text()) if saved.is_file() else None
        changes = config_changes(old, cfg.model_dump(mode="json")) if isinstance(old, Mapping) else []
        if changes:
            listed = ", ".join(f"{key}: {before!r} → {after!r}" for key, before, after in changes)
            logger.warning(
                "resuming %s with a config that changes training: %s (the checkpoint's config is %s)",
                resume_from,
                listed,
                saved,
            )
        if current.is_file() and current.read_text() != text:
            current.replace(output_dir / f"config.step_{step}.yaml")
    current.write_text(text)


def _flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, Mapping):
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out
