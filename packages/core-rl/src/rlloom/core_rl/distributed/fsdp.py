"""FSDP2 (`torch.distributed.fsdp.fully_shard`) sharding of a Hugging Face model, and full-size copies of its
weights and optimizer state for engines and checkpoints.

Each decoder layer is its own FSDP unit (parameters gathered just before the layer runs, freed after), the
embeddings and head go with the root. Checkpoints hold full tensors in the layout of a single-process
`PolicyActor`, so a run saved on N ranks resumes on M ranks, or on one process, and the other way round.
`distributed.shard_size` turns the flat mesh into a hybrid one (shard within a node, replicate across nodes) and
`distributed.cpu_offload` keeps the shards and optimizer state in CPU memory (config_fsdp.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor, distribute_tensor

VISION_TOWERS = ("visual", "vision_tower", "vision_model")
"""Attribute names of vision encoders in HF vision-language models (Qwen2/2.5-VL: `visual`)."""


MESH_DIMS = ("replicate", "shard")
"""The dimensions of a hybrid-sharding mesh: replicas across groups, shards within a group."""


def fsdp_mesh(world_size: int, shard_size: int | None, device_type: str) -> DeviceMesh | None:
    """The device mesh for `distributed.shard_size`: None (FSDP2's default 1-D mesh over all ranks) when every
    rank is in one shard group, else a 2-D ("replicate", "shard") mesh for hybrid sharding: consecutive ranks
    (one node's GPUs, as Ray places them) shard together, and groups hold replicas. Every rank must call it."""
    if shard_size is None or shard_size == world_size:
        return None
    if shard_size < 1 or world_size % shard_size:
        raise ValueError(
            f"distributed.shard_size={shard_size} does not divide the {world_size} ranks; use a divisor of "
            "distributed.num_ranks (the GPUs per node for one shard group per node)"
        )
    return init_device_mesh(device_type, (world_size // shard_size, shard_size), mesh_dim_names=MESH_DIMS)


def shard_model(
    model: nn.Module,
    mixed_precision: MixedPrecisionPolicy | None = None,
    *,
    mesh: DeviceMesh | None = None,
    cpu_offload: bool = False,
) -> nn.Module:
    """Shard `model` in place over the default process group (or `mesh`, see `fsdp_mesh`); returns it.

    Units are the classes HF lists in `_no_split_modules` (the decoder layers). Gradients are summed, not
    averaged, across ranks: each rank's loss is already divided by the whole mini-batch's token and sequence
    counts (see `LossAggregation`), so the sum is the single-process gradient; on a hybrid mesh they are
    reduce-scattered in the shard group and all-reduced across replicas, the same sum. `mixed_precision`
    (`precision.fsdp_mixed_precision`): each unit's fp32 shards are gathered and computed in bf16 and its
    gradients reduce-scattered in fp32, so the optimizer steps fp32 master weights. `cpu_offload`: FSDP2's
    `CPUOffloadPolicy`, which keeps the shards, their gradients (and so the optimizer's state and step) in CPU
    memory and copies each unit to the device only to compute; FSDP2 has no parameters-only or optimizer-only
    variant.
    """
    unit_names = set(getattr(model, "_no_split_modules", None) or [])
    # A vision tower stays in the root unit: text-only forwards never call it, and per-block units there would
    # put ranks that see images out of step with ranks that do not.
    towers = [m for name, m in model.named_modules() if name.rsplit(".", 1)[-1] in VISION_TOWERS]
    in_tower = {id(sub) for tower in towers for sub in tower.modules()}
    units = [m for m in model.modules() if type(m).__name__ in unit_names and m is not model and id(m) not in in_tower]
    if not units:
        raise ValueError(
            f"shard_model: {type(model).__name__} names no decoder-layer classes in _no_split_modules; "
            "FSDP2 needs per-layer units to keep memory bounded"
        )
    # a rank whose micro-batch has no image leaves the vision tower without gradients while a peer's has them:
    # FSDP must reduce zeros for it so both ranks' reduce-scatters have the same size. Text-only models use every
    # parameter in every forward, so they need no such call (torch 2.11, for one, does not have it).
    reduce_unused = bool(towers)
    if reduce_unused and not hasattr(FSDPModule, "set_reduce_scatter_unused_params"):
        raise ValueError(
            f"shard_model: {type(model).__name__} has a vision tower, and torch {torch.__version__} lacks "
            "FSDPModule.set_reduce_scatter_unused_params, without which ranks whose micro-batches differ in images "
            "would hang in the gradient reduce-scatter; install a torch that has it (2.13 does)"
        )
    options: dict[str, Any] = {"mp_policy": mixed_precision if mixed_precision is not None else MixedPrecisionPolicy()}
    if mesh is not None:
        options["mesh"] = mesh
    if cpu_offload:
        on_gpu = any(p.device.type == "cuda" for p in model.parameters())
        options["offload_policy"] = CPUOffloadPolicy(pin_memory=on_gpu)  # pinned: asynchronous copies to the GPU
    for unit in units:
        fully_shard(unit, **options)
    fully_shard(model, **options)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)  # plain SUM: gloo has no PREMUL_SUM
            if reduce_unused:
                module.set_reduce_scatter_unused_params(True)
    return model


def full_model_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The whole state dict on CPU at rank 0 (an empty dict elsewhere); every rank must call it."""
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    state = get_model_state_dict(model, options=options)
    return {name: value for name, value in state.items() if isinstance(value, torch.Tensor)}


def full_tensor_sizes(model: nn.Module) -> dict[str, int]:
    """Bytes of every state-dict entry at full size, in state-dict order (the same on every rank)."""
    return {name: value.numel() * value.element_size() for name, value in model.state_dict().items()}


def gather_full_tensors(model: nn.Module, names: list[str], *, to_rank0_only: bool = True) -> dict[str, torch.Tensor]:
    """The named state-dict entries at full size on CPU; every rank must call it with the same names (the
    gathers are collective). With `to_rank0_only`, ranks other than 0 return an empty dict."""
    state = model.state_dict()
    unknown = [name for name in names if name not in state]
    if unknown:
        raise KeyError(f"gather_full_tensors: {unknown[:3]} are not in the model's state dict")
    keep = not to_rank0_only or torch.distributed.get_rank() == 0
    out: dict[str, torch.Tensor] = {}
    for name in names:
        value = _full(state[name])
        if keep:
            out[name] = value.detach().cpu()
    return out


PEFT_PREFIX = "base_model.model."


def lora_scalings(model: nn.Module) -> dict[str, float]:
    """`{module name: scaling}` of every LoRA layer's active adapter (peft keeps it as a plain attribute)."""
    scalings: dict[str, float] = {}
    for name, module in model.named_modules():
        scaling = getattr(module, "scaling", None)
        if isinstance(scaling, dict) and hasattr(module, "lora_A") and hasattr(module, "base_layer"):
            if getattr(module, "fan_in_fan_out", False):
                raise NotImplementedError(f"{name}: LoRA with fan_in_fan_out (Conv1D layers) cannot be merged here")
            (adapter,) = getattr(module, "active_adapters", ["default"])
            scalings[name] = float(scaling[adapter])
    return scalings


def lora_sources(names: Iterable[str], scalings: Mapping[str, float]) -> dict[str, list[str]]:
    """`{merged HF name: the PeftModel state-dict names it is made from}`, in state-dict order: a LoRA layer's
    weight needs its base weight, then lora_A, then lora_B; every other tensor is itself."""
    names = list(names)
    adapters: dict[str, dict[str, str]] = {}  # module -> {"lora_A": name, "lora_B": name}
    for name in names:
        for kind in ("lora_A", "lora_B"):
            module, found, _ = name.partition(f".{kind}.")
            if found and name.endswith(".weight"):
                adapters.setdefault(module, {})[kind] = name
    sources: dict[str, list[str]] = {}
    for name in names:
        if ".lora_" in name:
            continue
        parts = [name]
        module = name.removesuffix(".base_layer.weight")
        if module != name and module in scalings:
            parts += [adapters[module]["lora_A"], adapters[module]["lora_B"]]
        sources[name.removeprefix(PEFT_PREFIX).replace(".base_layer", "")] = parts
    return sources


def merge_lora_state(state: Mapping[str, torch.Tensor], scalings: Mapping[str, float]) -> dict[str, torch.Tensor]:
    """Plain HF weights from (part of) a PeftModel's full state dict: W + scaling * B @ A for each LoRA layer,
    adapter tensors dropped, peft's name prefix and `.base_layer` removed (what `PolicyActor` sends an engine)."""
    merged: dict[str, torch.Tensor] = {}
    for target, parts in lora_sources(state, scalings).items():
        value = state[parts[0]]
        if len(parts) == 3:
            base, a_key, b_key = parts
            delta = (state[b_key].float() @ state[a_key].float()) * scalings[base.removesuffix(".base_layer.weight")]
            value = (value.float() + delta).to(value.dtype)
        merged[target] = value
    return merged


def full_optimizer_state(optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """`optimizer.state_dict()` with every sharded tensor gathered to full size on CPU, on every rank.

    The result has the single-process layout (parameter indices in `model.parameters()` order), which
    `PolicyActor.load_state_dict` reads as well. Every rank must call it (the gathers are collective).
    """
    state = optimizer.state_dict()
    state["state"] = {
        index: {key: _full(value) for key, value in per_param.items()} for index, per_param in state["state"].items()
    }
    return state


def load_full_optimizer_state(optimizer: torch.optim.Optimizer, state: Mapping[str, Any]) -> None:
    """Load a full-size optimizer state (from any number of ranks, or one process) into a sharded optimizer."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    local: dict[int, dict[str, Any]] = {}
    for index, per_param in state["state"].items():
        if not 0 <= int(index) < len(params):
            raise ValueError(
                f"optimizer state names parameter {index} but the model has {len(params)} trainable tensors; "
                "was the checkpoint written for another model?"
            )
        param = params[int(index)]
        local[int(index)] = {key: _shard_like(value, param, key) for key, value in per_param.items()}
    optimizer.load_state_dict({"state": local, "param_groups": state["param_groups"]})


def _full(value: Any) -> Any:
    if isinstance(value, DTensor):
        return value.full_tensor().cpu()
    return value


def _shard_like(value: Any, param: torch.Tensor, key: str) -> Any:
    if not isinstance(param, DTensor) or not isinstance(value, torch.Tensor) or value.dim() == 0:
        return value  # scalars (Adam's step) are replicated
    if tuple(value.shape) != tuple(param.shape):
        raise ValueError(
            f"optimizer state {key!r} has shape {tuple(value.shape)} but its parameter is {tuple(param.shape)}; "
            "was the checkpoint written for another model?"
        )
    mesh = param.device_mesh
    return distribute_tensor(value.to(param.to_local().device), mesh, param.placements, src_data_rank=None)


__all__ = [
    "MESH_DIMS",
    "fsdp_mesh",
    "full_model_state",
    "full_optimizer_state",
    "full_tensor_sizes",
    "gather_full_tensors",
    "load_full_optimizer_state",
    "lora_scalings",
    "lora_sources",
    "merge_lora_state",
    "shard_model",
]
