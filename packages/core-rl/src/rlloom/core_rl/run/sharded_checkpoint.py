"""Sharded checkpoints with `torch.distributed.checkpoint` (DCP): each rank writes its own shard of a worker's
weights and optimizer state, and any number of ranks (or one process) reads them back, resharded by DCP.

A ranked run's `step_N/` holds `sharded/actor/` (and `sharded/critic/`): DCP files of `{"model", "optim"}` from
`torch.distributed.checkpoint.state_dict.get_state_dict`, so no process ever builds the whole optimizer state,
plus the policy's `config.json` for `export_hf`. The worker's entry in `trainer_state.pt` is small: the
scheduler and shuffling state and `"shards": "sharded/<role>"`, a path relative to the checkpoint (checkpoints
are written in a temporary folder and renamed). Checkpoints of one process keep the Hugging Face layout
(`checkpoint.py`): one process holds the whole state anyway, and its step folders stay loadable as they are.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn
from torch.distributed.checkpoint.filesystem import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save
from torch.optim.lr_scheduler import LambdaLR

from rlloom.core_rl.workers.optim import configured_hyperparameters

SHARDED_DIR = "sharded"
"""Inside `step_N/`: one DCP folder per trained worker (`actor`, `critic`)."""
ADAPTER_CONFIG = "adapter_config.json"
"""Beside a LoRA policy's shards: its peft config (export_hf merges with its scaling)."""
SHARDS_KEY = "shards"
"""The key of a worker's `trainer_state.pt` entry that says its weights and optimizer are in DCP shards."""


@runtime_checkable
class ShardedWorker(Protocol):
    """A worker whose ranks write their own shards (`RayActorGroup`, `RayCritic`)."""

    def save_shards(self, path: str) -> None: ...

    def shard_state(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: Mapping[str, Any], /) -> None: ...


class Stateful(Protocol):
    def state_dict(self) -> Any: ...

    def load_state_dict(self, state: Any, /) -> Any: ...


class TrainedWorker(Protocol):
    """What a sharded save and load touch: `PolicyActor` and `ValueCritic`, in-process or on a rank."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: LambdaLR
    generator: torch.Generator


def shards_path(checkpoint: Path, role: str) -> Path:
    return checkpoint / SHARDED_DIR / role


def is_sharded(checkpoint: Path | None) -> bool:
    """Whether `checkpoint` (a `step_N/`) was written by ranks in DCP shards (it then holds no HF weights)."""
    return checkpoint is not None and (shards_path(checkpoint, "actor") / ".metadata").is_file()


def refuse_sharded(folder: Path, what: str) -> None:
    """A one-line error for a sharded checkpoint given where Hugging Face weights are expected."""
    if is_sharded(folder):
        raise ValueError(
            f"{what} {folder} is a checkpoint written by ranks (DCP shards, no Hugging Face weights); run "
            f"`rlloom-core-rl export-hf {folder} OUT_DIR` and give OUT_DIR"
        )


def weights_source(checkpoint: Path | None, model_path: str) -> str:
    """Where a resumed run loads its starting weights: an HF checkpoint's own, or for a sharded one the base
    model's (replaced by the shards right after, when the worker state loads)."""
    if checkpoint is None or is_sharded(checkpoint):
        return model_path
    return str(checkpoint)


def save_worker_shards(worker: TrainedWorker, path: str | Path, *, with_config: bool = False) -> None:
    """This rank's shard of the weights and optimizer state into `path` (every rank calls, with the same path);
    with `with_config`, rank 0 also writes the model's HF `config.json` there for `export_hf`."""
    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    model_state, optim_state = get_state_dict(worker.model, worker.optimizer)
    model_state = untied(model_state, worker.model)
    ranked = torch.distributed.is_initialized()
    writer = FileSystemWriter(folder)
    dcp_save({"model": model_state, "optim": optim_state}, storage_writer=writer, no_dist=not ranked)
    rank0 = not ranked or torch.distributed.get_rank() == 0
    if with_config and rank0:
        model: Any = worker.model
        if hasattr(model, "get_base_model"):  # peft: the HF model's config, and the adapter's for its scaling
            (adapter,) = model.active_adapters
            config = model.peft_config[adapter].to_dict()
            (folder / ADAPTER_CONFIG).write_text(json.dumps(config, indent=2, sort_keys=True, default=list))
            model = model.get_base_model()
        model.config.save_pretrained(folder)


def untied(state: Mapping[str, Any], model: nn.Module) -> dict[str, Any]:
    """`state` without the second names of tied parameters (the LM head that is the input embedding), so a tied
    weight is saved once."""
    every = {name for name, _ in model.named_parameters(remove_duplicate=False)}
    first = {name for name, _ in model.named_parameters()}
    return {name: value for name, value in state.items() if name not in every - first}


def shard_state(worker: TrainedWorker, role: str) -> dict[str, Any]:
    """The worker's small `trainer_state.pt` entry beside its shards (the same on every rank)."""
    return {
        SHARDS_KEY: f"{SHARDED_DIR}/{role}",
        "scheduler": worker.scheduler.state_dict(),
        "generator": worker.generator.get_state(),
    }


def resolved(state: Mapping[str, Any], checkpoint: Path | None) -> dict[str, Any]:
    """A worker entry with its shard folder made absolute (ranks may run in another folder)."""
    out = dict(state)
    if SHARDS_KEY in out and checkpoint is not None:
        out[SHARDS_KEY] = str((checkpoint / out[SHARDS_KEY]).absolute())
    return out


def load_worker_shards(worker: TrainedWorker, state: Mapping[str, Any]) -> None:
    """Weights and optimizer from the DCP folder `state["shards"]` (written by any number of ranks), then the
    schedule and shuffling state; the resumed config's lr and decay win, as for a full-state resume."""
    folder = Path(state[SHARDS_KEY])
    if not (folder / ".metadata").is_file():
        raise FileNotFoundError(
            f"{folder} holds no DCP checkpoint (.metadata is missing); the checkpoint was not written completely: "
            "resume from an earlier step_N"
        )
    model_state, optim_state = get_state_dict(worker.model, worker.optimizer)  # this rank's layout, to fill
    wanted = {"model": untied(model_state, worker.model), "optim": optim_state}
    # every wanted key must be in the files; DCP reads the parts of each saved shard this rank's layout covers
    dcp_load(wanted, storage_reader=FileSystemReader(folder), no_dist=not torch.distributed.is_initialized())
    with configured_hyperparameters(worker.optimizer, worker.scheduler):
        # not strict: a tied weight's second name was not saved (filling the first fills it)
        set_state_dict(
            worker.model,
            worker.optimizer,
            model_state_dict=wanted["model"],
            optim_state_dict=wanted["optim"],
            options=StateDictOptions(strict=False),
        )
        worker.scheduler.load_state_dict(state["scheduler"])
    worker.generator.set_state(state["generator"])


def worker_state(worker: Stateful) -> Any:
    """A worker's `trainer_state.pt` entry: shard folder and small state for ranks, the whole state for one
    process."""
    return worker.shard_state() if isinstance(worker, ShardedWorker) else worker.state_dict()


def load_worker_state(worker: Stateful, saved: Mapping[str, Any], checkpoint: Path | None) -> None:
    """Give a worker its entry from any checkpoint: ranks read shards or a full state (an older checkpoint, or
    one process's); one process reads its own full state, or the shards ranks wrote."""
    state = resolved(saved, checkpoint)
    if SHARDS_KEY in state and not isinstance(worker, ShardedWorker):
        load_worker_shards(worker, state)  # type: ignore[arg-type]  # in-process PolicyActor / ValueCritic
    else:
        worker.load_state_dict(state)


def shard_bytes(path: str | Path) -> dict[str, int]:
    """Bytes of each file in a DCP folder (`__<rank>_0.distcp` per rank, `.metadata` from rank 0)."""
    return {file.name: file.stat().st_size for file in sorted(Path(path).iterdir()) if file.is_file()}


__all__ = [
    "ADAPTER_CONFIG",
    "SHARDED_DIR",
    "SHARDS_KEY",
    "ShardedWorker",
    "TrainedWorker",
    "is_sharded",
    "load_worker_shards",
    "load_worker_state",
    "refuse_sharded",
    "resolved",
    "save_worker_shards",
    "shard_bytes",
    "shard_state",
    "shards_path",
    "untied",
    "weights_source",
    "worker_state",
]
