"""veRL's between-phase offload (`distributed.param_offload`, `distributed.optimizer_offload`): a rank's sharded
parameters and AdamW state leave the compute device between the calls that use them (so the rollout engine has
that memory while it generates) and come back for the next forward or update.

Not FSDP2's `CPUOffloadPolicy` (`distributed.cpu_offload`), which keeps the state in CPU memory for good, copies
every layer to the device at every forward and steps the optimizer on the CPU: here the state is whole on the
device during a call and moves only between calls. The move works on storages, so every tensor object FSDP2 and
the optimizer hold stays the same: each storage's bytes are copied into a host buffer (pinned when the device is a
GPU, and kept for the next move, so only the first move pays for pinning) and the device storage is resized to
zero bytes; reloading resizes it and copies the bytes back, bit for bit. A forward or optimizer step on state
that is away would read freed memory (a crash, not an error), so each guards its model and optimizer with a hook
that raises instead.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule

LabelledTensors = list[tuple[str, torch.Tensor]]


def parameter_tensors(model: nn.Module) -> LabelledTensors:
    """This rank's local shard of every parameter (and of its gradient, if one is held), labelled by name."""
    out: LabelledTensors = []
    for name, param in model.named_parameters():
        out.append((name, _local(param)))
        if param.grad is not None:
            out.append((f"{name}.grad", _local(param.grad)))
    return out


def sharded_parameters(model: nn.Module) -> LabelledTensors:
    """`parameter_tensors` after dropping the full-size copies FSDP2 may still hold (the root keeps its gathered
    parameters after a no-grad forward), so that only the shards are left: what an offload moves."""
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()
    return parameter_tensors(model)


def optimizer_tensors(optimizer: torch.optim.Optimizer) -> LabelledTensors:
    """This rank's local shard of every per-parameter optimizer tensor (AdamW's moments); scalars such as Adam's
    `step` stay where they are (a few bytes, and on the CPU already unless the optimizer is capturable)."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    out: LabelledTensors = []
    for index, param in enumerate(params):
        for key, value in optimizer.state.get(param, {}).items():
            if isinstance(value, torch.Tensor) and value.dim() > 0:
                out.append((f"{index}.{key}", _local(value)))
    return out


def resident_bytes(tensors: LabelledTensors) -> int:
    """Bytes the tensors' storages hold on their device now (0 while offloaded), each storage counted once."""
    seen: dict[int, int] = {}
    for _, tensor in tensors:
        storage = tensor.untyped_storage()
        if storage.nbytes():
            seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


@dataclass
class _Moved:
    device_bytes: torch.Tensor  # uint8 view of a whole device storage (empty while offloaded)
    host: torch.Tensor  # uint8 copy of it in host memory


class StateOffload:
    """Moves one set of tensors (`collect()`, read again at every offload: optimizer state appears at the first
    step) off `device` and back. Reference-counted, so overlapping users (a training call and an engine's weight
    sync on another thread) keep the state on the device until the last one is done."""

    def __init__(
        self,
        collect: Callable[[], LabelledTensors],
        device: torch.device,
        *,
        what: str,
        guard: nn.Module | torch.optim.Optimizer | None = None,
    ) -> None:
        self.collect = collect
        self.what = what  # for the error: "the actor's parameters"
        self.device = device
        self.pinned = device.type == "cuda"  # pinned host memory: fast, asynchronous copies to and from a GPU
        self._moved: list[_Moved] | None = None
        self._host: dict[str, torch.Tensor] = {}  # pinned buffers kept for the next move, by label
        self._users = 0
        self._lock = threading.Lock()
        if isinstance(guard, nn.Module):
            guard.register_forward_pre_hook(self._refuse_when_away, prepend=True)  # before FSDP2's all-gather
        elif guard is not None:
            guard.register_step_pre_hook(self._refuse_when_away)

    @property
    def offloaded(self) -> bool:
        return self._moved is not None

    def offload(self) -> None:
        """Copy every storage to host memory and free it on the device (no-op when already away or in use)."""
        with self._lock:
            if self._moved is None and self._users == 0:
                self._offload()

    def reload(self) -> None:
        """Bring the state back onto the device (no-op when it is there)."""
        with self._lock:
            self._reload()

    def acquire(self) -> None:
        """On the device until the matching `release` (reloaded now if away)."""
        with self._lock:
            self._reload()
            self._users += 1

    def release(self) -> None:
        """Offloaded again when the last user releases."""
        with self._lock:
            self._users -= 1
            if self._users == 0:
                self._offload()

    @contextmanager
    def resident(self) -> Iterator[None]:
        """On the device for the duration; offloaded again when the last overlapping user leaves."""
        self.acquire()
        try:
            yield
        finally:
            self.release()

    def _refuse_when_away(self, *_: object) -> None:
        if self._moved is not None:
            raise RuntimeError(
                f"{self.what} are offloaded (distributed.param_offload / optimizer_offload) and were used outside "
                "a call that brings them back; run it through RankWorker.call, or inside StateOffload.resident()"
            )

    def _offload(self) -> None:
        moved: list[_Moved] = []
        seen: set[int] = set()
        for label, tensor in self.collect():
            storage = tensor.untyped_storage()
            size = storage.nbytes()
            if size == 0 or storage.data_ptr() in seen:  # empty shards; storages shared by several tensors
                continue
            seen.add(storage.data_ptr())
            device_bytes = torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)
            host = self._host_buffer(label, size)
            host.copy_(device_bytes, non_blocking=self.pinned)
            moved.append(_Moved(device_bytes, host))
        self._synchronize()  # the copies must land before the device memory is given back
        for item in moved:
            item.device_bytes.untyped_storage().resize_(0)
        self._moved = moved
        if self.pinned:
            torch.cuda.empty_cache()  # hand the freed blocks to other allocators too (a vLLM engine's)

    def _reload(self) -> None:
        if self._moved is None:
            return
        for item in self._moved:
            size = item.host.numel()
            item.device_bytes.untyped_storage().resize_(size)
            item.device_bytes.copy_(item.host, non_blocking=self.pinned)
        self._synchronize()
        self._moved = None

    def _host_buffer(self, label: str, size: int) -> torch.Tensor:
        buffer = self._host.get(label)
        if buffer is None or buffer.numel() != size:
            buffer = torch.empty(size, dtype=torch.uint8, pin_memory=self.pinned)
            if self.pinned:  # unpinned buffers are not kept: on a CPU rank the state would live twice
                self._host[label] = buffer
        return buffer

    def _synchronize(self) -> None:
        if self.pinned:
            torch.cuda.current_stream(self.device).synchronize()


OPTIMIZER_CALLS = frozenset(
    {"update_policy", "update_critic", "state_dict", "load_state_dict", "save_shards", "shard_state", "load_state"}
)
"""Calls on a role that use its optimizer state as well as its parameters (updates and checkpoints)."""
STATELESS_CALLS = frozenset({"weight_bucket_plan", "state_bytes"})
"""Calls on a role that read only shapes, never values: they leave the state where it is."""
ENGINE_CALLS_ON_THE_ACTOR = frozenset({"load_own_shards"})
"""Calls on a rank's engine that read the actor's parameters (its weight sync from this rank's shards)."""


class PhaseOffloads:
    """The between-phase offload of one rank's workers (`RankWorker.roles`: actor, reference, critic). Every
    call on a role brings back the state it uses (parameters; optimizer state too for `OPTIMIZER_CALLS`) and
    sends it away again when it returns, as veRL does around its compute_log_prob, update_actor and weight sync:
    so the state is away while the engine generates (its calls use none), and on the device for each forward."""

    def __init__(self, roles: Mapping[str, Any], *, parameters: bool, optimizer: bool, device: torch.device) -> None:
        self.parameters: dict[str, StateOffload] = {}
        self.optimizer: dict[str, StateOffload] = {}
        by_model: dict[int, StateOffload] = {}  # with LoRA the reference is the actor's own model
        for role in ("actor", "reference", "critic"):
            worker = roles.get(role)
            if worker is None:
                continue
            model = worker.model
            if parameters:
                if id(model) not in by_model:
                    by_model[id(model)] = StateOffload(
                        partial(sharded_parameters, model), device, what=f"the {role}'s parameters", guard=model
                    )
                self.parameters[role] = by_model[id(model)]
            if optimizer and getattr(worker, "optimizer", None) is not None:
                self.optimizer[role] = StateOffload(
                    partial(optimizer_tensors, worker.optimizer),
                    device,
                    what=f"the {role}'s optimizer state",
                    guard=worker.optimizer,
                )

    def offload_all(self) -> None:
        for offload in (*self.parameters.values(), *self.optimizer.values()):
            offload.offload()

    def needed(self, role: str, method: str) -> list[StateOffload]:
        """What `role.method` uses of the offloaded state."""
        if role == "engine":
            return (
                [self.parameters["actor"]] if method in ENGINE_CALLS_ON_THE_ACTOR and "actor" in self.parameters else []
            )
        if method in STATELESS_CALLS:
            return []
        out = [self.parameters[role]] if role in self.parameters else []
        if method in OPTIMIZER_CALLS and role in self.optimizer:
            out.append(self.optimizer[role])
        return out

    @contextmanager
    def on_device(self, role: str, method: str) -> Iterator[None]:
        """`role.method`'s state on the device for the call, away again after it."""
        with ExitStack() as stack:
            for offload in self.needed(role, method):
                stack.enter_context(offload.resident())
            yield


def placement(worker: Any) -> dict[str, int]:
    """Bytes of a worker's parameter shards and optimizer state held on their device now, read from the live
    storages (not from the offload's own records): 0 while offloaded."""
    optimizer = getattr(worker, "optimizer", None)
    return {
        "parameters": resident_bytes(parameter_tensors(worker.model)),
        "optimizer": resident_bytes(optimizer_tensors(optimizer)) if optimizer is not None else 0,
    }


def _local(tensor: torch.Tensor) -> torch.Tensor:
    to_local = getattr(tensor, "to_local", None)  # a DTensor's shard on this rank
    return to_local() if callable(to_local) else tensor


__all__ = [
    "ENGINE_CALLS_ON_THE_ACTOR",
    "OPTIMIZER_CALLS",
    "STATELESS_CALLS",
    "PhaseOffloads",
    "StateOffload",
    "optimizer_tensors",
    "parameter_tensors",
    "placement",
    "resident_bytes",
    "sharded_parameters",
]
