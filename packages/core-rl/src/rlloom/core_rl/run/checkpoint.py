"""Atomic, resumable checkpoints: `checkpoints/step_N/` plus a `latest` pointer.

`step_N/` holds the policy in Hugging Face format with its tokenizer (so `from_pretrained(step_N)` loads it),
`critic/` when there is one, `trainer_state.pt` (optimizer, scheduler, dataloader position and excluded prompts,
RNG states, KL and entropy controllers, prompt-filter counts, step) and `config.yaml`. A run on ranks writes no
HF weights and no full optimizer state: each rank writes its DCP shard into `sharded/` (`sharded_checkpoint`,
`rlloom-core-rl export-hf` makes an HF folder), and `trainer_state.pt` stays small. Everything is written into
a hidden temporary directory that is renamed into place only when complete, and `latest` is replaced atomically
after that, so a crash mid-save leaves the previous checkpoint and pointer untouched. Older checkpoints beyond
`keep_last` are deleted after the new one is in place; after a resume from an earlier checkpoint, those of the
abandoned later steps count as the oldest.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import shutil
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

LATEST = "latest"
STATE_FILE = "trainer_state.pt"
_STEP_DIR = re.compile(r"^step_(\d+)$")


def rng_state() -> dict[str, Any]:
    """Python, numpy and torch (CPU and CUDA) RNG states."""
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: Mapping[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


@contextlib.contextmanager
def preserved_rng() -> Iterator[None]:
    """Run a block (validation, a probe) without moving the run's RNG streams: a seeded run then trains the same
    whether or not, and how often, it validates."""
    saved = rng_state()
    try:
        yield
    finally:
        set_rng_state(saved)


def save_checkpoint(
    checkpoint_dir: str | Path,
    step: int,
    *,
    write_model: Callable[[Path], None],
    trainer_state: Mapping[str, Any],
    config_yaml: str,
    keep_last: int,
) -> Path:
    """Write `step_<step>/` atomically, point `latest` at it, prune old ones; returns the checkpoint path.

    `write_model(dir)` saves the HF-format weights and tokenizer (and the critic) into `dir`.
    """
    root = Path(checkpoint_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step}"
    tmp = root / f".tmp_step_{step}_{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    write_model(tmp)
    torch.save(dict(trainer_state), tmp / STATE_FILE)
    (tmp / "config.yaml").write_text(config_yaml)
    _fsync_tree(tmp)
    if final.exists():  # re-saving a step (e.g. after a resume with a different total): swap atomically-ish
        old = root / f".old_step_{step}_{os.getpid()}"
        final.rename(old)
        tmp.rename(final)
        shutil.rmtree(old)
    else:
        tmp.rename(final)
    pointer_tmp = root / f".{LATEST}.tmp"
    pointer_tmp.write_text(final.name)
    os.replace(pointer_tmp, root / LATEST)
    _prune(root, keep_last, step)
    return final


def latest_checkpoint(checkpoint_dir: str | Path) -> Path | None:
    """The checkpoint `latest` names, or the highest complete `step_N/` if the pointer is missing."""
    root = Path(checkpoint_dir)
    if root.is_dir():
        recover_interrupted_resaves(root)
    pointer = root / LATEST
    if pointer.exists():
        target = root / pointer.read_text().strip()
        if (target / STATE_FILE).exists():
            return target
    steps = sorted((int(m.group(1)), p) for p in root.glob("step_*") if (m := _STEP_DIR.match(p.name)))
    complete = [p for _, p in steps if (p / STATE_FILE).exists()]
    return complete[-1] if complete else None


def fresh_run_dir(output_dir: str | Path | None, prefix: str) -> Path:
    """`output_dir`, or `runs/<prefix>-<timestamp>`; refused if it already holds checkpoints (a demo starts fresh)."""
    run_dir = (
        Path(output_dir) if output_dir is not None else Path("runs") / f"{prefix}-{time.strftime('%Y%m%d-%H%M%S')}"
    )
    if (run_dir / "checkpoints").exists():
        raise FileExistsError(f"{run_dir} already holds a run; pass a new --out (the demo always starts fresh)")
    return run_dir


def load_trainer_state(path: str | Path) -> dict[str, Any]:
    """The `trainer_state.pt` of a checkpoint (our own file: it holds numpy RNG arrays, so not weights_only)."""
    file = Path(path) / STATE_FILE
    if not file.exists():
        raise FileNotFoundError(f"{path} is not a complete checkpoint: {STATE_FILE} is missing")
    state: dict[str, Any] = torch.load(file, weights_only=False, map_location="cpu")
    return state


def _prune(root: Path, keep_last: int, newest: int) -> None:
    """Keep the `keep_last` most recent checkpoints, `step_<newest>` (just written) always among them.

    Checkpoints past `newest` belong to a timeline the run rewound from (resumed from an earlier checkpoint): they
    count as the oldest, so they never crowd out the new one, and `latest_checkpoint`'s highest-step fallback
    cannot pick one of them once they are gone (their `metrics.jsonl` lines were dropped on resume too).
    """
    recover_interrupted_resaves(root)  # first: a checkpoint put back in place counts among the kept ones
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := _STEP_DIR.match(p.name))]
    # abandoned ones (past `newest`) first, then by step
    steps = sorted(found, key=lambda item: (item[0] <= newest, item[0]))
    for _, path in steps[:-keep_last]:
        shutil.rmtree(path, ignore_errors=True)
    for stale in root.glob(".tmp_step_*"):  # left by a crash mid-save
        if not stale.name.endswith(f"_{os.getpid()}"):
            shutil.rmtree(stale, ignore_errors=True)


_OLD_STEP_DIR = re.compile(r"^\.old_step_(\d+)_(\d+)$")


def recover_interrupted_resaves(root: Path) -> None:
    """A crash while re-saving a step leaves `.old_step_N_<pid>`: the previous `step_N`, moved aside. If the new
    `step_N` never arrived, the old one is the checkpoint and goes back in place; otherwise it is deleted (pruning
    never looked at these, so each crash left a whole checkpoint behind)."""
    for old in root.glob(".old_step_*"):
        match = _OLD_STEP_DIR.match(old.name)
        if match is None or int(match.group(2)) == os.getpid():
            continue  # this process's own re-save in progress
        final = root / f"step_{match.group(1)}"
        if not final.exists() and (old / STATE_FILE).exists():
            old.rename(final)
        else:
            shutil.rmtree(old, ignore_errors=True)


def _fsync_tree(path: Path) -> None:
    """Flush file contents to disk before the rename that publishes them."""
    for file in path.rglob("*"):
        if file.is_file():
            with file.open("rb") as handle:
                os.fsync(handle.fileno())
